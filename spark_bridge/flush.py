"""The flush step: one sealed block -> Spark DataFrame -> optional transform -> ClickHouse.

Exactly-once relies on ClickHouse block deduplication. The block's rows are sorted by
(``_partition``, ``_offset``) and cut into ``ceil(rows / rows_per_task)`` contiguous slices;
slice ``i`` is Spark partition ``i`` and is inserted by ONE request with the token
``<token_prefix>:<block_id>:<i>``. Re-flushing the same block (same rows, same id, same
`rows_per_task`) repeats the same tasks with the same tokens, so ClickHouse drops every
insert it already has, whether the first attempt finished, died half way, or Spark retried a
task. This holds while the table's deduplication window exceeds the number of insert blocks
written between the first attempt and the re-flush (see `tables.TableSpec.dedup_window`).

Each task fetches its slice from the driver over Arrow Flight (`handoff`); the slices never
become Spark rows unless a transform needs them. Without a transform, the job is a plain RDD
job of one task per slice (no SQL planning, no Arrow conversion through the JVM) that inserts
its slice as it came. Flushing needs a classic SparkSession (the block lives in the driver).
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import structlog

from spark_bridge.connection import Connection
from spark_bridge.datasource import ClickHouseOptions, insert_task, spark_arrow_type
from spark_bridge.handoff import SliceHandoff, fetch_slice
from spark_bridge.replicas import Failover, Replica, RetryPolicy
from spark_bridge.transform import Transform, check_partitioning, load_transform

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = structlog.get_logger("spark_bridge.flush")

PARTITION_COLUMN = "_partition"
OFFSET_COLUMN = "_offset"
DEFAULT_ROWS_PER_TASK = 500_000
_REPORT_SCHEMA = "task INT, rows BIGINT"


class FlushBlock(Protocol):
    """A sealed block: its id and its rows (data columns plus ``_partition``/``_offset``)."""

    @property
    def block_id(self) -> str: ...

    def to_table(self) -> pa.Table: ...


@dataclass(frozen=True)
class FlushTarget:
    """Where and how a block is written. `transform` is ``module:function`` or a SQL SELECT
    over the view ``block``; `token_prefix` is the pipeline name."""

    database: str
    table: str
    replicas: tuple[Replica, ...]
    token_prefix: str
    connection: Connection = field(default_factory=Connection)
    transform: str | None = None
    rows_per_task: int = DEFAULT_ROWS_PER_TASK
    retry: RetryPolicy = field(default_factory=RetryPolicy)

    def __post_init__(self) -> None:
        if self.rows_per_task < 1:
            raise ValueError(f"rows_per_task must be >= 1, got {self.rows_per_task}")
        if not self.token_prefix:
            raise ValueError("token_prefix (the pipeline name) is required")


@dataclass(frozen=True)
class FlushResult:
    """A block acknowledged by ClickHouse: rows written (after the transform), Spark tasks,
    the replica that took it, wall time and the number of write attempts."""

    block_id: str
    rows: int
    tasks: int
    replica: str | None
    seconds: float
    attempts: int


class FlushError(Exception):
    """The block could not be flushed as one deterministic set of tasks."""


def sorted_block(block: FlushBlock) -> pa.Table:
    """The block's rows sorted by (``_partition``, ``_offset``), dictionaries decoded."""
    table = block.to_table()
    missing = [c for c in (PARTITION_COLUMN, OFFSET_COLUMN) if c not in table.column_names]
    if missing:
        raise FlushError(f"block {block.block_id}: missing meta columns {missing}")
    decoded = [
        col.dictionary_decode() if pa.types.is_dictionary(col.type) else col
        for col in table.columns
    ]
    table = pa.Table.from_arrays(decoded, names=table.column_names)
    # Consumed batches keep each partition's offsets ascending, so a stable sort on the
    # partition alone (a counting sort, 20x cheaper than the two-key sort) is usually enough.
    table = table.take(pc.sort_indices(table[PARTITION_COLUMN]))
    if _offsets_ascending_per_partition(table):
        return table
    return table.sort_by([(PARTITION_COLUMN, "ascending"), (OFFSET_COLUMN, "ascending")])


def _offsets_ascending_per_partition(table: pa.Table) -> bool:
    """True if, in a table grouped by partition, offsets strictly rise within each partition."""
    partitions = table[PARTITION_COLUMN].to_numpy()
    offsets = table[OFFSET_COLUMN].to_numpy()
    same = partitions[1:] == partitions[:-1]
    return bool(np.all(~same | (offsets[1:] > offsets[:-1])))


def task_slices(rows: int, rows_per_task: int) -> list[tuple[int, int]]:
    """``(offset, length)`` of each task: ``ceil(rows / rows_per_task)`` contiguous slices of
    near-equal size, a pure function of its arguments."""
    if rows == 0:
        return []
    tasks = math.ceil(rows / rows_per_task)
    size = math.ceil(rows / tasks)
    return [(start, min(size, rows - start)) for start in range(0, rows, size)]


def _report(task: int, rows: int) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict(
        {"task": pa.array([task], pa.int32()), "rows": pa.array([rows], pa.int64())}
    )


def _slice_ids(batches: Iterator[pa.RecordBatch]) -> Iterator[int]:
    for batch in batches:
        yield from batch.column(0).to_pylist()


def _fetch_and_insert(
    location: str, tickets: Sequence[bytes], options: ClickHouseOptions, tasks: Iterator[int]
) -> Iterator[tuple[int, int]]:
    """Executor side, no transform: insert slice `i` (the RDD element) as task `i`."""
    for task in tasks:
        yield task, insert_task(options, task, fetch_slice(location, tickets[task])).rows


def _fetch(
    location: str, tickets: Sequence[bytes], batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """Executor side: the rows of slice `i` (the range value) as Arrow batches."""
    for task in _slice_ids(batches):
        yield from fetch_slice(location, tickets[task])


def _insert_partition(
    options: ClickHouseOptions, batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """Executor side, after a transform: insert this Spark partition as its task."""
    from pyspark import TaskContext

    context = TaskContext.get()
    assert context is not None
    task = context.partitionId()
    yield _report(task, insert_task(options, task, batches).rows)


def _spark_compatible(table: pa.Table) -> pa.Table:
    """`table` cast to the exact Arrow types Spark uses for its columns."""
    from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema

    widened = pa.schema(
        [pa.field(f.name, spark_arrow_type(f.type), f.nullable) for f in table.schema]
    )
    return table.cast(to_arrow_schema(from_arrow_schema(widened)))


class _BlockWrite:
    """One block's slices, offered to the tasks of `write` until `close`."""

    def __init__(
        self, spark: SparkSession, table: pa.Table, target: FlushTarget, block_id: str
    ) -> None:
        self.spark = spark
        self.target = target
        self.transform: Transform | None = (
            load_transform(target.transform) if target.transform else None
        )
        if self.transform is not None:
            table = _spark_compatible(table)
        self.schema = table.schema
        self.slices = task_slices(table.num_rows, target.rows_per_task)
        self.token_prefix = f"{target.token_prefix}:{block_id}"
        try:
            self.context = spark.sparkContext
        except Exception as exc:  # Spark Connect has no SparkContext
            raise FlushError("flush needs a classic SparkSession (not Spark Connect)") from exc
        host = self.context.getConf().get("spark.driver.host", "127.0.0.1")
        self.handoff = SliceHandoff(host, [table.slice(o, n) for o, n in self.slices])

    def close(self) -> None:
        self.handoff.close()

    def write(self, replica: Replica) -> list[tuple[int, int]]:
        """``(task, rows)`` for every task, written to `replica`."""
        options = ClickHouseOptions(
            hosts=((replica.host, replica.port),),
            database=self.target.database,
            table=self.target.table,
            connection=self.target.connection,
            token_prefix=self.token_prefix,
        )
        count = len(self.slices)
        location, tickets = self.handoff.location, self.handoff.tickets
        if self.transform is None:
            insert = functools.partial(_fetch_and_insert, location, tickets, options)
            tasks = self.context.parallelize(range(count), count)
            return list(tasks.mapPartitions(insert).collect())
        from pyspark.sql.pandas.types import from_arrow_schema

        block_df = self.spark.range(0, count, 1, count).mapInArrow(
            functools.partial(_fetch, location, tickets), from_arrow_schema(self.schema)
        )
        out = self.transform(block_df)
        check_partitioning(out, f"transform {self.target.transform!r}")
        df = out.mapInArrow(functools.partial(_insert_partition, options), _REPORT_SCHEMA)
        return [(int(row[0]), int(row[1])) for row in df.collect()]


def flush(spark: SparkSession, block: FlushBlock, target: FlushTarget) -> FlushResult:
    """Write `block` to one writable replica of `target`; returns once ClickHouse acknowledged
    every task. Raises `FlushError`, `NoWritableReplicaError`, `ReplicasExhaustedError` or
    `TransformError`; a raised flush may have written some tasks, and
    re-flushing the same block completes it without duplicates."""
    started = time.monotonic()
    table = sorted_block(block)
    if table.num_rows == 0:
        return FlushResult(block.block_id, 0, 0, None, time.monotonic() - started, 0)
    write = _BlockWrite(spark, table, target, block.block_id)
    try:
        reports, replica, attempts = Failover(target.connection, target.retry).run(
            target.replicas, write.write
        )
    finally:
        write.close()
    tasks = sorted(task for task, _ in reports)
    if tasks != list(range(len(write.slices))):
        raise FlushError(
            f"block {block.block_id}: expected tasks 0..{len(write.slices) - 1}, Spark ran {tasks}"
        )
    rows = sum(count for _, count in reports)
    if write.transform is None and rows != table.num_rows:
        raise FlushError(f"block {block.block_id}: inserted {rows} of {table.num_rows} rows")
    result = FlushResult(
        block.block_id, rows, len(tasks), replica.name, time.monotonic() - started, attempts
    )
    log.info(
        "flush.written",
        block_id=result.block_id,
        rows=result.rows,
        tasks=result.tasks,
        replica=result.replica,
        attempts=result.attempts,
        seconds=round(result.seconds, 3),
    )
    return result
