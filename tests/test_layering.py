"""The layers of `hakafka` import downwards only, and nothing shipped imports `devstack`.

    cli -> ops | daemon -> pipeline -> foundation -> coordination | consumer -> libraries

`hakafka.cli` is the argparse layer over the operator commands (`hakafka.ops`) and the
daemon (`hakafka.daemon`), which never import each other: an operator command must work
without loading Spark or the daemon. The daemon runs pipelines (`hakafka.pipeline`), which
know nothing of the daemon or the commands. The foundation (config, settings, metrics, and
below them logs, faults, sdnotify) serves every layer above it; coordination and consumer
are the bottom layer, configured through their own settings objects (never the config) and
free to use only logs, faults and sdnotify. The libraries (wal, buffer, spark_bridge) never
import hakafka: tests/test_package_boundaries.py. docs/DESIGN.md, "Layout", states the same.

Imports are read from the source (AST), function-local and TYPE_CHECKING ones included.
"""

from __future__ import annotations

import pytest

from tests.source_imports import ROOT, imports, module_of, source_files, within

SHIPPED = ("hakafka", "wal", "buffer", "spark_bridge")
# Files that may import devstack: the dev tooling itself, its tests and the benchmarks.
DEV = ("devstack", "tests", "bench")

CLI, OPS, DAEMON, PIPELINE = "hakafka.cli", "hakafka.ops", "hakafka.daemon", "hakafka.pipeline"
COORDINATION, CONSUMER = "hakafka.coordination", "hakafka.consumer"
# The foundation: these build on types of coordination and consumer ...
ON_BOTTOM = (
    "hakafka.config",
    "hakafka.settings",
    "hakafka.metrics",
    "hakafka.drift",
    "hakafka.table_columns",
)
# ... and these three on nothing of hakafka; the bottom layer may use them.
BASE = ("hakafka.logs", "hakafka.faults", "hakafka.sdnotify")
ABOVE_FOUNDATION = (PIPELINE, DAEMON, OPS, CLI)

# Every part of hakafka and the parts it must never import.
NEVER: dict[str, tuple[str, ...]] = {
    CLI: (),
    OPS: (DAEMON, PIPELINE, CLI),
    DAEMON: (OPS, CLI),
    PIPELINE: (DAEMON, OPS, CLI),
    **{part: ABOVE_FOUNDATION for part in ON_BOTTOM},
    **{part: (*ABOVE_FOUNDATION, *ON_BOTTOM, COORDINATION, CONSUMER) for part in BASE},
    COORDINATION: (*ABOVE_FOUNDATION, *ON_BOTTOM, CONSUMER),
    CONSUMER: (*ABOVE_FOUNDATION, *ON_BOTTOM, COORDINATION),
    # The package itself holds only the version.
    "hakafka": (*ABOVE_FOUNDATION, *ON_BOTTOM, *BASE, COORDINATION, CONSUMER),
}


def part_of(module: str) -> str | None:
    """The part of hakafka `module` belongs to (the longest matching name), or None. The
    part `hakafka` is the package's `__init__.py` only."""
    matches = [part for part in NEVER if within(module, part) and part != "hakafka"]
    return max(matches, key=len, default="hakafka" if module == "hakafka" else None)


def test_every_hakafka_module_belongs_to_a_layer() -> None:
    # A new module must be placed in NEVER (and so in a layer) before it can be imported.
    files = source_files("hakafka")
    assert files
    unplaced = [module_of(p) for p in files if part_of(module_of(p)) is None]
    assert unplaced == [], f"modules outside every layer of hakafka: {unplaced}"


@pytest.mark.parametrize("part", list(NEVER))
def test_part_imports_no_higher_or_sibling_layer(part: str) -> None:
    files = [p for p in source_files("hakafka") if part_of(module_of(p)) == part]
    assert files, f"no source file of {part}"
    offending = [
        f"{p.relative_to(ROOT)}:{line} imports {module}"
        for p in files
        for line, module in imports(p)
        if any(within(module, banned) for banned in NEVER[part])
    ]
    assert offending == [], f"{part} must not import {', '.join(NEVER[part])}:\n" + "\n".join(
        offending
    )


def test_only_dev_tooling_tests_and_benchmarks_import_devstack() -> None:
    tops = sorted(
        p.name
        for p in ROOT.iterdir()
        if p.is_dir() and not p.name.startswith(".") and p.name not in ("build",)
    )
    assert set(SHIPPED) <= set(tops)
    offending = [
        f"{p.relative_to(ROOT)}:{line} imports {module}"
        for p in source_files(*tops)
        if p.relative_to(ROOT).parts[0] not in DEV
        for line, module in imports(p)
        if within(module, "devstack")
    ]
    assert offending == [], "only devstack/, tests/ and bench/ may import devstack:\n" + (
        "\n".join(offending)
    )
