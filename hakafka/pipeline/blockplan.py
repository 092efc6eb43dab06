"""A block's flush plan: which offsets each flush task writes, recorded before the first attempt.

The flush lane plans a sealed block (`plan_block`) and writes the plan into the pending
intent before anything reaches ClickHouse: per task, the offset ranges it holds, its row and
dead-letter counts and a digest of which offsets those are, plus the settings that decided
the rows (`block_settings`). A re-flush (after an error, or by the next leader after a
crash) never plans again: `follow_plan` cuts the rebuilt block along the recorded tasks and
checks that each holds exactly the recorded rows and dead letters, so a task's token names
the same rows whatever the flushing node's `rows_per_task`. A block that does not match (a
re-fetch that returned other messages, a config that decodes them differently) is refused
with `BlockMismatchError`, never written.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa

from chlib.chtypes import canonical_type, split_top_level
from hakafka.config import PipelineConfig
from hakafka.consumer import SchemaError, arrow_type
from hakafka.coordination import PendingIntent, TaskRecord
from hakafka.pipeline.buffer import ArrowBlock, PipelineBlock
from spark_bridge.plan import (
    FlushTask,
    PlanError,
    Span,
    TaskRange,
    cut,
    offsets_digest,
    plan_tasks,
    sorted_rows,
    task_slices,
)

Settings = tuple[tuple[str, str], ...]


class BlockMismatchError(Exception):
    """A rebuilt pending block differs from its recorded plan; flushing it could lose or
    duplicate rows, so the pipeline stops. The message names the block and what differs."""


@dataclass(frozen=True)
class PlannedBlock:
    """A block ready to flush: rows and dead letters sorted by (`_partition`, `_offset`),
    the task records for the intent, and each table's tasks."""

    block: PipelineBlock
    tasks: tuple[TaskRecord, ...]
    rows: tuple[FlushTask, ...]
    dead: tuple[FlushTask, ...]


def block_settings(config: PipelineConfig) -> Settings:
    """The pipeline settings that decide which rows and dead letters an offset becomes."""
    # A path decides a column's value too; columns without one read as before paths existed.
    columns = ", ".join(
        f"{c.name} {c.clickhouse_type}" + (f" at {c.path}" if c.path else "")
        for c in config.columns
    )
    return (
        ("columns", columns),
        ("format", str(config.format)),
        ("on_error", str(config.on_error)),
        ("transform", config.transform),
    )


def _sorted(block: PipelineBlock) -> tuple[pa.Table, pa.Table | None]:
    what = f"block {block.block_id}"
    rows = sorted_rows(block.rows.table, what)
    dead = block.dead_letters
    return rows, None if dead is None else sorted_rows(dead.table, f"{what} (dead letters)")


def _with_tables(block: PipelineBlock, rows: pa.Table, dead: pa.Table | None) -> PipelineBlock:
    return dataclasses.replace(
        block,
        rows=ArrowBlock(block.block_id, rows),
        dead_letters=None if dead is None else ArrowBlock(block.block_id, dead),
    )


def _no_rows() -> pa.Table:
    return pa.table({"_partition": pa.array([], pa.int32()), "_offset": pa.array([], pa.int64())})


def _cut(
    block: PipelineBlock, rows: pa.Table, dead: pa.Table | None, ranges: Sequence[TaskRange]
) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    what = f"block {block.block_id}"
    try:
        row_slices = cut(rows, ranges, what)
        dead_slices = cut(dead if dead is not None else _no_rows(), ranges, f"{what} dead letters")
    except PlanError as exc:
        raise BlockMismatchError(str(exc)) from None
    return row_slices, dead_slices


def _digest(
    rows: pa.Table, dead: pa.Table | None, row: tuple[int, int], gone: tuple[int, int]
) -> str:
    dead_part = _no_rows() if dead is None else dead.slice(*gone)
    return offsets_digest(rows.slice(*row)) + offsets_digest(dead_part)


def plan_block(block: PipelineBlock, rows_per_task: int) -> PlannedBlock:
    """Cut a sealed block into tasks of about `rows_per_task` rows along its offsets."""
    rows, dead = _sorted(block)
    bounds = {p: (r.first, r.last + 1) for (_, p), r in block.ranges.items()}
    topics = ",".join(sorted({t for t, _ in block.ranges}))
    ranges = plan_tasks(rows, bounds, rows_per_task, scope=topics)
    row_slices, dead_slices = _cut(block, rows, dead, ranges)
    records = tuple(
        TaskRecord(
            key=r.key,
            spans=tuple((s.partition, s.first, s.end) for s in r.spans),
            rows=row[1],
            dead=gone[1],
            digest=_digest(rows, dead, row, gone),
        )
        for r, row, gone in zip(ranges, row_slices, dead_slices, strict=True)
    )
    return _planned(block, (rows, dead), records, (row_slices, dead_slices))


def _planned(
    block: PipelineBlock,
    tables: tuple[pa.Table, pa.Table | None],
    records: tuple[TaskRecord, ...],
    slices: tuple[Sequence[tuple[int, int]], Sequence[tuple[int, int]]],
) -> PlannedBlock:
    keys = [t.key for t in records]
    (rows, dead), (row_slices, dead_slices) = tables, slices
    return PlannedBlock(
        _with_tables(block, rows, dead),
        records,
        tuple(FlushTask(k, s, n) for k, (s, n) in zip(keys, row_slices, strict=True)),
        tuple(FlushTask(k, s, n) for k, (s, n) in zip(keys, dead_slices, strict=True)),
    )


def follow_plan(
    block: PipelineBlock, intent: PendingIntent, settings: Settings, rows_per_task: int
) -> PlannedBlock:
    """The rebuilt pending `block` cut along the tasks `intent` recorded; BlockMismatchError
    if the settings that decide its rows changed or a task would hold other rows.

    An intent from a version before plans (no tasks) is flushed as that version did: rows
    and dead letters each in ``rows_per_task`` slices under the keys ``<block>:<i>``."""
    rows, dead = _sorted(block)
    if not intent.tasks:
        return _legacy(block, rows, dead, rows_per_task)
    _check_settings(block.block_id, dict(intent.settings), dict(settings))
    ranges = [TaskRange(tuple(Span(*s) for s in t.spans)) for t in intent.tasks]
    row_slices, dead_slices = _cut(block, rows, dead, ranges)
    count = len(intent.tasks)
    for i, (task, rng, row, gone) in enumerate(
        zip(intent.tasks, ranges, row_slices, dead_slices, strict=True)
    ):
        where = f"block {block.block_id}, task {i + 1} of {count} ({rng})"
        if (row[1], gone[1]) != (task.rows, task.dead):
            raise BlockMismatchError(
                f"{where}: recorded {task.rows} rows and {task.dead} dead letters, "
                f"rebuilt {row[1]} rows and {gone[1]} dead letters; refusing to flush it"
            )
        if _digest(rows, dead, row, gone) != task.digest:
            raise BlockMismatchError(
                f"{where}: same counts as recorded but other offsets became rows or dead "
                "letters; refusing to flush it"
            )
    return _planned(block, (rows, dead), intent.tasks, (row_slices, dead_slices))


def _check_settings(block_id: str, recorded: dict[str, str], current: dict[str, str]) -> None:
    """Refuse a re-flush under settings that decode the block's offsets differently. Columns
    may only have been added (their values are null for the block's rows) or made Nullable
    (the WAL converter's rule: the same Arrow form, now nullable)."""
    changed = [
        f"{key}: recorded {recorded.get(key)!r}, now {current.get(key)!r}"
        for key in sorted(set(recorded) | set(current))
        if key != "columns" and recorded.get(key) != current.get(key)
    ]
    had = _columns(recorded.get("columns", ""))
    now = _columns(current.get("columns", ""))
    lost = [
        f"{name} {type_}" + (f" at {path}" if path else "")
        for name, (type_, path) in had.items()
        if name not in now or not (now[name][1] == path and _keeps_values(type_, now[name][0]))
    ]
    if lost:
        changed.append(f"columns {lost} were removed or retyped")
    if changed:
        raise BlockMismatchError(
            f"block {block_id} was planned under other pipeline settings ({'; '.join(changed)});"
            " restore them until the pending block is flushed (hakafka status shows it)"
        )


def _columns(text: str) -> dict[str, tuple[str, str]]:
    """The `columns` setting (`name Type[ at path], ...`) as name -> (type, path)."""
    found: dict[str, tuple[str, str]] = {}
    for entry in split_top_level(text, ", ") if text else []:
        name, _, rest = entry.partition(" ")
        type_, *path = split_top_level(rest, " at ")
        found[name] = (type_, path[0] if path else "")
    return found


def _keeps_values(recorded: str, current: str) -> bool:
    """True if a column of type `recorded` reads the block's rows alike as `current`: the same
    type, or the same made Nullable (`T` -> `Nullable(T)`, `LowCardinality(T)` ->
    `LowCardinality(Nullable(T))`)."""
    if canonical_type(recorded) == canonical_type(current):
        return True
    try:
        before, after = arrow_type(recorded), arrow_type(current)
    except SchemaError:
        return False
    return not before.nullable and after == dataclasses.replace(before, nullable=True)


def _legacy(
    block: PipelineBlock, rows: pa.Table, dead: pa.Table | None, rows_per_task: int
) -> PlannedBlock:
    def tasks(table: pa.Table | None) -> tuple[FlushTask, ...]:
        slices = task_slices(0 if table is None else table.num_rows, rows_per_task)
        return tuple(FlushTask(f"{block.block_id}:{i}", s, n) for i, (s, n) in enumerate(slices))

    return PlannedBlock(_with_tables(block, rows, dead), (), tasks(rows), tasks(dead))
