"""How a block is cut into flush tasks, and how a task is named: by the offsets it holds.

A block's rows carry ``_partition`` and ``_offset``. Sorted by (partition, offset), they are
cut into contiguous tasks of about ``rows_per_task`` rows. A task is recorded as the offset
ranges it holds per partition (its `TaskRange`): the block's own bounds are split at each
task's first row, so every offset of the block, whether it became a row, a dead letter or
nothing (a transaction marker, a compacted offset), belongs to exactly one task.

The deduplication token of a task derives from its ranges, so a token always names the same
offsets: a re-flush that cuts the rows along the recorded ranges (`cut`) repeats the same
tokens with the same rows, whatever its own ``rows_per_task``, and a rebuilt block that does
not fit the ranges is refused (`PlanError`) instead of written under a token that ClickHouse
already holds for other rows.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

PARTITION_COLUMN = "_partition"
OFFSET_COLUMN = "_offset"
_MIN_RUN = 1000  # rows: below this on average, moving runs costs more than copying rows

Bounds = Mapping[int, tuple[int, int]]
"""{partition: (first, end)}: the offsets a block holds, end exclusive."""


class PlanError(Exception):
    """Rows that do not fit a block's recorded task ranges (the message names which)."""


@dataclass(frozen=True, order=True)
class Span:
    """Offsets ``first`` to ``end - 1`` of one partition."""

    partition: int
    first: int
    end: int

    def __str__(self) -> str:
        return f"partition {self.partition} offsets {self.first}..{self.end - 1}"


@dataclass(frozen=True)
class TaskRange:
    """The offsets one flush task holds: spans in (partition, offset) order, none empty, of
    the source `scope` names (the topic: offsets of two topics are not the same rows)."""

    spans: tuple[Span, ...]
    scope: str = ""

    @property
    def key(self) -> str:
        """A digest of the scope and spans: the same offsets always give the same key."""
        spans = ";".join(f"{s.partition}:{s.first}-{s.end}" for s in self.spans)
        return hashlib.blake2b(f"{self.scope}|{spans}".encode(), digest_size=12).hexdigest()

    def __str__(self) -> str:
        return ", ".join(map(str, self.spans))


@dataclass(frozen=True)
class FlushTask:
    """Rows ``start`` to ``start + rows - 1`` of a sorted block, inserted under the token
    ``<token_prefix>:<key>``."""

    key: str
    start: int
    rows: int


def task_slices(rows: int, rows_per_task: int) -> list[tuple[int, int]]:
    """``(offset, length)`` of each task: ``ceil(rows / rows_per_task)`` contiguous slices of
    near-equal size, a pure function of its arguments."""
    if rows == 0:
        return []
    tasks = math.ceil(rows / rows_per_task)
    size = math.ceil(rows / tasks)
    return [(start, min(size, rows - start)) for start in range(0, rows, size)]


def sorted_rows(table: pa.Table, what: str) -> pa.Table:
    """`table` sorted by (``_partition``, ``_offset``) with dictionaries decoded; returned as
    is when it already is. `what` names the table in errors."""
    missing = [c for c in (PARTITION_COLUMN, OFFSET_COLUMN) if c not in table.column_names]
    if missing:
        raise PlanError(f"{what}: missing meta columns {missing}")
    if any(pa.types.is_dictionary(col.type) for col in table.columns):
        decoded = [
            col.cast(col.type.value_type) if pa.types.is_dictionary(col.type) else col
            for col in table.columns
        ]
        table = pa.Table.from_arrays(decoded, names=table.column_names)
    keys = _keys(table)
    if _is_sorted(*keys):
        return table
    moved = _runs_in_order(table, *keys)
    if moved is not None:
        return moved
    # Short runs: a stable sort on the partition alone (a counting sort, 20x cheaper than the
    # two-key sort) is usually enough, as each partition's offsets still rise.
    table = table.take(pc.sort_indices(table[PARTITION_COLUMN]))
    if _is_sorted(*_keys(table)):
        return table
    return table.sort_by([(PARTITION_COLUMN, "ascending"), (OFFSET_COLUMN, "ascending")])


def _runs_in_order(table: pa.Table, partitions: np.ndarray, offsets: np.ndarray) -> pa.Table | None:
    """`table` (whose `_keys` are `partitions` and `offsets`) sorted by moving its runs
    (stretches of one partition with rising offsets) as zero-copy slices; None if the runs are
    short (under `_MIN_RUN` rows on average) or overlap.

    A consumed batch holds each partition's messages in a run, so a block is a few runs per
    batch: reordering them copies no row, where a `take` copied the whole block."""
    breaks = (partitions[1:] != partitions[:-1]) | (offsets[1:] <= offsets[:-1])
    starts = np.flatnonzero(np.r_[True, breaks])
    if len(starts) * _MIN_RUN > len(partitions):
        return None
    stops = np.r_[starts[1:], len(partitions)]
    order = np.lexsort((offsets[starts], partitions[starts]))
    starts, stops = starts[order], stops[order]
    same = partitions[starts][1:] == partitions[starts][:-1]
    if np.any(same & (offsets[starts][1:] <= offsets[stops - 1][:-1])):
        return None
    return pa.concat_tables(
        [table.slice(int(a), int(b - a)) for a, b in zip(starts, stops, strict=True)]
    )


def _keys(table: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    return table[PARTITION_COLUMN].to_numpy(), table[OFFSET_COLUMN].to_numpy()


def _is_sorted(partitions: np.ndarray, offsets: np.ndarray) -> bool:
    """True if partitions never fall and offsets strictly rise within each partition."""
    rising = partitions[1:] > partitions[:-1]
    same = partitions[1:] == partitions[:-1]
    return bool(np.all(rising | (same & (offsets[1:] > offsets[:-1]))))


def bounds_of(table: pa.Table) -> dict[int, tuple[int, int]]:
    """The bounds of a sorted table's own rows: per partition, first offset to last + 1."""
    partitions, offsets = _keys(table)
    bounds: dict[int, tuple[int, int]] = {}
    if len(partitions) == 0:
        return bounds
    starts = np.flatnonzero(np.r_[True, partitions[1:] != partitions[:-1]])
    stops = np.r_[starts[1:], len(partitions)]
    for start, stop in zip(starts, stops, strict=True):
        bounds[int(partitions[start])] = (int(offsets[start]), int(offsets[stop - 1]) + 1)
    return bounds


def plan_tasks(
    table: pa.Table, bounds: Bounds, rows_per_task: int, scope: str = ""
) -> tuple[TaskRange, ...]:
    """The task ranges of a block of source `scope`: its sorted rows `table` cut into slices
    of about `rows_per_task` rows, and its `bounds` split at each slice's first row. A block
    without rows is one task (its dead letters, if any, still need one)."""
    if rows_per_task < 1:
        raise ValueError(f"rows_per_task must be >= 1, got {rows_per_task}")
    partitions, offsets = _keys(table)
    cuts = [
        (int(partitions[start]), int(offsets[start]))
        for start, _ in task_slices(table.num_rows, rows_per_task)[1:]
    ]
    tasks: list[list[Span]] = [[]]
    for partition, (start, end) in sorted(bounds.items()):
        first = start
        while cuts and cuts[0][0] == partition and first <= cuts[0][1] < end:
            at = cuts.pop(0)[1]
            if at > first:
                tasks[-1].append(Span(partition, first, at))
                first = at
            tasks.append([])
        if first < end:
            tasks[-1].append(Span(partition, first, end))
    if cuts:  # a row outside the bounds starts a task: the block is inconsistent
        raise PlanError(f"rows at {cuts} lie outside the block's offsets {dict(bounds)}")
    return tuple(TaskRange(tuple(spans), scope) for spans in tasks if spans)


def cut(table: pa.Table, tasks: Sequence[TaskRange], what: str) -> list[tuple[int, int]]:
    """``(offset, length)`` in the sorted `table` of each task's rows. PlanError, naming
    `what` and the first rows concerned, when some rows lie in no task's ranges."""
    partitions, offsets = _keys(table)
    slices: list[tuple[int, int]] = []
    position = 0
    for task in tasks:
        start = position
        for span in task.spans:
            lo = int(np.searchsorted(partitions, span.partition, "left"))
            hi = int(np.searchsorted(partitions, span.partition, "right"))
            begin = lo + int(np.searchsorted(offsets[lo:hi], span.first, "left"))
            stop = lo + int(np.searchsorted(offsets[lo:hi], span.end, "left"))
            if begin != position:
                _outside(table, position, begin, what)
            position = stop
        slices.append((start, position - start))
    if position != table.num_rows:
        _outside(table, position, table.num_rows, what)
    return slices


def _outside(table: pa.Table, at: int, upto: int, what: str) -> None:
    partitions, offsets = _keys(table)
    stray = min(upto, at + 3) if upto > at else at + 1
    found = [(int(p), int(o)) for p, o in zip(partitions[at:stray], offsets[at:stray], strict=True)]
    raise PlanError(
        f"{what}: rows at (partition, offset) {found} lie outside the recorded task ranges"
    )


def offsets_digest(table: pa.Table) -> str:
    """A digest of a sorted table's (``_partition``, ``_offset``) pairs: which rows it holds."""
    partitions, offsets = _keys(table)
    digest = hashlib.blake2b(digest_size=12)
    digest.update(np.ascontiguousarray(partitions, dtype=np.int64).tobytes())
    digest.update(np.ascontiguousarray(offsets, dtype=np.int64).tobytes())
    return digest.hexdigest()
