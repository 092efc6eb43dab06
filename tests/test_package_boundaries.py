"""`wal`, `buffer` and `spark_bridge` stand alone: none imports `hakafka` (docs/DESIGN.md)."""

from __future__ import annotations

import pytest

from tests.fresh import fresh_python
from tests.source_imports import ROOT, imports, module_of, source_files, within

PACKAGES = ["wal", "buffer", "spark_bridge"]


def modules(package: str) -> list[str]:
    """Every importable module of ``package``; ``__main__`` is left out (importing it runs
    the CLI and exits)."""
    return [module_of(p) for p in source_files(package) if p.stem != "__main__"]


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
