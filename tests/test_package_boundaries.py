"""The libraries (`wal`, `buffer`, `retry_policy`, `chlib`, `spark_bridge`) stand alone: none
imports `hakafka`, and each imports only the libraries it builds on (docs/DESIGN.md). The
ClickHouse library and the parts of hakafka an operator command loads never load pyspark.
And no test module imports another: what tests share is in tests/helpers."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.fresh import fresh_python
from tests.source_imports import ROOT, imports, module_of, source_files, within

# Each library and the other libraries it may import.
BUILDS_ON: dict[str, tuple[str, ...]] = {
    "wal": (),
    "buffer": ("retry_policy",),
    "retry_policy": (),
    "chlib": ("retry_policy",),
    "spark_bridge": ("chlib", "buffer", "retry_policy"),
}
PACKAGES = list(BUILDS_ON)
# Top-level packages of this repository that a library could import by mistake.
PROJECT = ("hakafka", "devstack", "bench", "tests", *PACKAGES)


def modules(package: str) -> list[str]:
    """Every importable module of ``package``; ``__main__`` is left out (importing it runs
    the CLI and exits)."""
    return [module_of(p) for p in source_files(package) if p.stem != "__main__"]


@pytest.mark.parametrize("package", PACKAGES)
def test_importing_the_package_loads_no_hakafka_module(package: str) -> None:
    # A fresh interpreter: this one has hakafka loaded already (tests/conftest.py).
    names = modules(package)
    assert package in names
    code = (
        f"import {', '.join(names)}; import sys; "
        "print(sorted(m for m in sys.modules if m == 'hakafka' or m.startswith('hakafka.')))"
    )
    found = fresh_python(code).strip()
    assert found == "[]", f"importing {package} loaded {found}"


@pytest.mark.parametrize("package", PACKAGES)
def test_a_library_imports_only_the_libraries_it_builds_on(package: str) -> None:
    files = source_files(package)
    assert files
    allowed = (package, *BUILDS_ON[package])
    offending = [
        f"{path.relative_to(ROOT)}:{line} imports {module}"
        for path in files
        for line, module in imports(path)
        if any(within(module, top) for top in PROJECT)
        and not any(within(module, top) for top in allowed)
    ]
    assert offending == [], f"{package} may import only {allowed}:\n" + "\n".join(offending)


def test_chlib_the_config_and_the_operator_commands_load_no_pyspark() -> None:
    # Creating tables, reading a config and the operator commands need ClickHouse, never
    # Spark (seconds to import): they must work on a host where Spark is broken.
    names = [
        *modules("chlib"),
        *[module_of(p) for p in source_files("hakafka/config", "hakafka/ops")],
        "hakafka.settings",
    ]
    code = (
        f"import {', '.join(names)}; import sys; "
        "print(sorted(m for m in sys.modules if m == 'pyspark' or m.startswith('pyspark.')))"
    )
    found = fresh_python(code).strip()
    assert found == "[]", f"importing {names} loaded {found}"


# An import of a test module at a line's start: in code, or in source text that a test runs
# in another interpreter (which the AST sees only as a string).
TEST_MODULE_IMPORT = re.compile(r"\s*(?:from|import)\s+(tests(?:\.\w+)*\.test_\w+)\b")


def imported_test_modules(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import of a test module (`tests.….test_*`) in `path`."""
    found = {
        (line, module)
        for line, module in imports(path)
        if within(module, "tests") and module.rsplit(".", 1)[-1].startswith("test_")
    }
    for number, text in enumerate(path.read_text().splitlines(), 1):
        if match := TEST_MODULE_IMPORT.match(text):
            found.add((number, match[1]))
    return sorted(found)


def test_no_test_module_imports_another_test_module() -> None:
    # What test modules share lives in tests/helpers (or a conftest fixture): importing a
    # test module runs its module code again and ties its tests to another module's.
    files = source_files("tests")
    assert files
    offending = [
        f"{path.relative_to(ROOT)}:{line} imports {module}"
        for path in files
        for line, module in imported_test_modules(path)
    ]
    assert offending == [], "test modules import test modules:\n" + "\n".join(offending)
