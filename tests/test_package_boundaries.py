"""`wal`, `buffer`, `spark_bridge` and `retry_policy` stand alone: none imports `hakafka`
(docs/DESIGN.md).
And no test module imports another: what tests share is in tests/helpers."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.fresh import fresh_python
from tests.source_imports import ROOT, imports, module_of, source_files, within

PACKAGES = ["wal", "buffer", "spark_bridge", "retry_policy"]


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
def test_no_source_file_imports_hakafka(package: str) -> None:
    files = source_files(package)
    assert files
    offending = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in files
        for line, module in imports(path)
        if within(module, "hakafka")
    ]
    assert offending == [], f"{package} imports hakafka at {', '.join(offending)}"


def test_spark_bridge_loads_pyspark_only_for_the_spark_parts() -> None:
    # The package imports its names on first use: tables, connections, replicas and the
    # session settings are plain Python (what `hakafka init` and the config need).
    plain = [
        "spark_bridge",
        "spark_bridge.connection",
        "spark_bridge.replicas",
        "spark_bridge.runtime",
        "spark_bridge.tables",
    ]
    code = (
        f"import {', '.join(plain)}; import sys; "
        "from spark_bridge import Connection, Engine, Replica, SparkSettings, TableSpec; "
        "print(sorted(m for m in sys.modules if m == 'pyspark' or m.startswith('pyspark.')))"
    )
    found = fresh_python(code).strip()
    assert found == "[]", f"importing {plain} loaded {found}"


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
