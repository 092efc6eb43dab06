"""The layers of `hakafka` import downwards only, and nothing shipped imports `devstack`.

    cli -> ops | daemon -> pipeline -> foundation -> coordination | consumer -> libraries

`hakafka.cli` is the argparse layer over the operator commands (`hakafka.ops`) and the
daemon (`hakafka.daemon`), which never import each other: an operator command must work
without loading Spark or the daemon. The daemon runs pipelines (`hakafka.pipeline`), which
know nothing of the daemon or the commands. The foundation (config, settings, metrics, and
below them logs, faults, sdnotify) serves every layer above it; coordination and consumer
are the bottom layer, configured through their own settings objects (never the config) and
free to use only logs, faults and sdnotify. The libraries (wal, buffer, retry_policy, chlib,
spark_bridge) never import hakafka: tests/test_package_boundaries.py. docs/DESIGN.md,
"Layout", states the same.
And no modules of the shipped packages import one another in a circle, inside a package
either (`import_graph` says which imports count).

Imports are read from the source (AST), function-local and TYPE_CHECKING ones included.
"""

from __future__ import annotations

import itertools
from collections import deque
from pathlib import Path

import pytest

from tests.source_imports import ROOT, imports, module_of, source_files, within

SHIPPED = ("hakafka", "wal", "buffer", "chlib", "spark_bridge", "retry_policy")
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
# ... and these on nothing of hakafka; the bottom layer may use them.
BASE = ("hakafka.logs", "hakafka.faults", "hakafka.sdnotify", "hakafka.typed_reader")
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


# Import cycles that were there when the cycle test came (issue #36), each as the set of its
# imports (importer, imported). Do not add one: break a new cycle instead. An entry must
# match a cycle still there exactly, so a cycle that grows fails and a fixed one leaves.
KNOWN_CYCLES = {
    # Type-only: the snapshot names the table's `OffsetRange` and `TopicPartition` in its
    # annotations (`if TYPE_CHECKING`); the table builds snapshots.
    frozenset({("buffer.snapshot", "buffer.table"), ("buffer.table", "buffer.snapshot")}),
}

Graph = dict[str, dict[str, tuple[Path, int]]]


def import_graph() -> Graph:
    """The modules of the shipped packages, each with the modules of those packages it imports
    and where (file, line of the first such import).

    Every import statement counts: at module level, `if TYPE_CHECKING` blocks included (the
    type checker follows them, and they are how one module depends on another's types), and
    inside functions. A function-local import runs when the function does, so it is as much
    a dependency as any other; deferring it hides a circle from the interpreter, not from the
    design, and the consumer circle of issue #36 ran through one (`make_decoder` imported
    `avro` and `protobuf` in the function, and both imported `decode` at module level).
    Importing `a.b` also runs package `a`, which is not counted: every package would
    otherwise form a cycle with the modules its `__init__` imports from."""
    paths = {module_of(path): path for path in source_files(*SHIPPED)}
    graph: Graph = {}
    for module, path in paths.items():
        edges: dict[str, tuple[Path, int]] = {}
        for line, name in imports(path):
            imported = owner(name, paths)
            if imported is not None and imported != module:
                edges.setdefault(imported, (path, line))
        graph[module] = edges
    return graph


def owner(name: str, modules: dict[str, Path]) -> str | None:
    """The module of `modules` that `name` (a module, or a name inside one) lies in; None for
    a name from elsewhere (stdlib, third party)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def reached(graph: Graph, start: str) -> set[str]:
    """The modules `start` imports, directly or through others (itself only via a cycle)."""
    seen: set[str] = set()
    todo = list(graph[start])
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo += graph[module]
    return seen


def cycles(graph: Graph) -> list[tuple[frozenset[str], frozenset[tuple[str, str]]]]:
    """The import cycles of `graph`: each group of modules that import one another, directly
    or not (a strongly connected component), with the imports among them."""
    reach = {module: reached(graph, module) for module in graph}
    groups = {
        frozenset(other for other in reach[module] if module in reach[other])
        for module in graph
        if module in reach[module]
    }
    return [
        (group, frozenset((a, b) for a in group for b in graph[a] if b in group))
        for group in sorted(groups, key=sorted)
    ]


def shortest_cycle(graph: Graph, group: frozenset[str], start: str) -> list[str]:
    """The shortest chain of imports inside `group` from `start` back to `start`."""
    back: dict[str, str] = {}
    todo = deque([start])
    while todo:
        module = todo.popleft()
        for imported in sorted(graph[module]):
            if imported == start:
                chain = [module]
                while chain[-1] != start:
                    chain.append(back[chain[-1]])
                return [*reversed(chain), start]
            if imported in group and imported not in back:
                back[imported] = module
                todo.append(imported)
    raise AssertionError(f"{start} is in no cycle of {sorted(group)}")


def described(graph: Graph, group: frozenset[str]) -> list[str]:
    """The cycles through each module of `group` (the shortest one each, without repeats), as
    `a -> b (a's file:line) -> ... -> a (file:line)`."""
    lines: list[str] = []
    seen: set[frozenset[str]] = set()
    for start in sorted(group):
        chain = shortest_cycle(graph, group, start)
        if frozenset(chain) in seen:
            continue
        seen.add(frozenset(chain))
        steps = [chain[0]]
        for importer, imported in itertools.pairwise(chain):
            path, line = graph[importer][imported]
            steps.append(f"{imported} ({path.relative_to(ROOT)}:{line})")
        lines.append("  " + " -> ".join(steps))
    return lines


def test_no_import_cycle_between_modules() -> None:
    graph = import_graph()
    assert "hakafka.consumer.schema" in graph and "wal" in graph
    found = [(group, edges) for group, edges in cycles(graph) if edges not in KNOWN_CYCLES]
    report = [line for group, _ in found for line in described(graph, group)]
    assert found == [], "import cycles (module -> imported module (where)):\n" + "\n".join(report)


def test_every_known_import_cycle_is_still_there_unchanged() -> None:
    # An entry of KNOWN_CYCLES that matches nothing is a cycle fixed: remove it.
    there = {edges for _, edges in cycles(import_graph())}
    assert KNOWN_CYCLES - there == set()
