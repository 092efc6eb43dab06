"""`wal`, `buffer` and `spark_bridge` stand alone: none imports `hakafka` (docs/DESIGN.md)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.fresh import fresh_python

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ["wal", "buffer", "spark_bridge"]


def modules(package: str) -> list[str]:
    """Every importable module of ``package``; ``__main__`` is left out (importing it runs
    the CLI and exits)."""
    names = []
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__main__":
            continue
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


@pytest.mark.parametrize("package", PACKAGES)
def test_importing_the_package_loads_no_hakafka_module(package: str) -> None:
    # A fresh interpreter: this one has hakafka loaded already (tests/conftest.py).
    names = modules(package)
    assert package in names and len(names) > 1
    code = (
        f"import {', '.join(names)}; import sys; "
        "print(sorted(m for m in sys.modules if m == 'hakafka' or m.startswith('hakafka.')))"
    )
    found = fresh_python(code).strip()
    assert found == "[]", f"importing {package} loaded {found}"


def hakafka_imports(path: Path) -> list[str]:
    """``file:line`` of every ``import hakafka...`` / ``from hakafka... import`` in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        if any(name == "hakafka" or name.startswith("hakafka.") for name in names):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


@pytest.mark.parametrize("package", PACKAGES)
def test_no_source_file_imports_hakafka(package: str) -> None:
    files = sorted((ROOT / package).rglob("*.py"))
    assert files
    offending = [where for path in files for where in hakafka_imports(path)]
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
