"""The flush step: one sealed block -> Spark DataFrame -> optional transform -> ClickHouse.

Exactly-once relies on ClickHouse block deduplication. A block is flushed as a list of
`FlushTask`s, each a contiguous slice of its rows sorted by (``_partition``, ``_offset``)
under a key (see `plan`: the key is a digest of the offsets the task holds). Task ``i`` is
Spark partition ``i`` and is inserted by ONE request with the token ``<token_prefix>:<key>``.
Re-flushing the same tasks repeats the same tokens, so ClickHouse drops every insert it
already has, whether the first attempt finished, died half way, or Spark retried a task.
This holds while the table's deduplication window exceeds the number of insert blocks
written between the first attempt and the re-flush (see `tables.TableSpec.dedup_window`).
`flush_block` plans the tasks itself (by ``rows_per_task``); a caller that must re-flush
with the same tasks later (the daemon) records the plan and calls `flush` with it.

Each task fetches its slice from this process over Arrow Flight (`handoff`, at
`runtime.handoff_address`, served as `FlushTarget.handoff` says: TLS, a port range); the
slices never become Spark rows unless a transform needs them. The handoff's `SliceSource`
(tickets, and the CAs its certificate is verified against) reaches the tasks in the job's
closure, never in Spark's conf; a task that does not trust the certificate fails the flush at
once with `HandoffTrustError` (no other replica or attempt can mend it).
The job is one pass over `range(tasks)` in as many partitions: an RDD on a classic session
(local or a cluster), a DataFrame on Spark Connect (no RDDs there; its server reaches this
process only through the handoff) or when a transform needs the rows. Without a transform
each task inserts its slice as it came, and only its report (task, rows) passes through the
JVM.
"""

from __future__ import annotations

import functools
import gc
import importlib
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import pyarrow as pa
import structlog

from chlib.connection import Connection
from chlib.replicas import Failover, Replica, RetryPolicy
from spark_bridge.datasource import ClickHouseOptions, insert_task, spark_arrow_type
from spark_bridge.handoff import HandoffOptions, HandoffTrustError, SliceHandoff, SliceSource
from spark_bridge.plan import FlushTask, bounds_of, cut, plan_tasks, sorted_rows
from spark_bridge.runtime import handoff_address
from spark_bridge.transform import Transform, check_partitioning, load_transform

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = structlog.get_logger("spark_bridge.flush")

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
    over the view ``block``; `token_prefix` is the pipeline name; `handoff` how the tasks are
    handed the block's slices (TLS, ports)."""

    database: str
    table: str
    replicas: tuple[Replica, ...]
    token_prefix: str
    connection: Connection = field(default_factory=Connection)
    transform: str | None = None
    rows_per_task: int = DEFAULT_ROWS_PER_TASK
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    handoff: HandoffOptions = field(default_factory=HandoffOptions)

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


def _report(task: int, rows: int) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict(
        {"task": pa.array([task], pa.int32()), "rows": pa.array([rows], pa.int64())}
    )


def _slice_ids(batches: Iterator[pa.RecordBatch]) -> Iterator[int]:
    for batch in batches:
        yield from batch.column(0).to_pylist()


@functools.cache
def _freeze_worker_heap() -> None:
    """Once per Python worker, after its first task: put the objects its imports and pooled
    clients made out of the collector's sight (`gc.freeze`). Spark's worker runs a full
    `gc.collect()` after every task, which walked them all: 11 ms of CPU per task idle,
    up to 50 ms under load, whatever the task's size."""
    gc.collect()
    gc.freeze()


def import_task_modules() -> None:
    """Import what a flush task loads beyond this module's own imports: clickhouse-connect's
    HTTP client (`Connection.client` imports it on first use)."""
    importlib.import_module("clickhouse_connect.driver.httpclient")


def _warm_worker(task_ids: Iterable[int]) -> Iterator[int]:
    """Executor side: what a Python worker's first flush task would pay before its work (this
    module's imports, `import_task_modules`, the heap freeze), paid now."""
    import_task_modules()
    _freeze_worker_heap()
    yield from task_ids


def warm_workers(spark: SparkSession) -> None:
    """Start the Python workers a flush will run on: one task per core of a classic session,
    so a leader's first flush does not wait for each worker's start and imports (0.5 s of CPU
    each). A Spark Connect server starts its workers when its first flush comes."""
    if _is_connect(spark):
        return
    slots = spark.sparkContext.defaultParallelism
    started = time.monotonic()
    spark.sparkContext.parallelize(range(slots), slots).mapPartitions(_warm_worker).collect()
    log.info("spark.workers_warm", workers=slots, seconds=round(time.monotonic() - started, 3))


def _fetch_and_insert(
    source: SliceSource, options: ClickHouseOptions, task_ids: Iterable[int]
) -> Iterator[tuple[int, int]]:
    """Executor side, no transform: insert slice `i` as task `i` for each of `task_ids`;
    ``(task, rows)`` for each."""
    for task in task_ids:
        yield task, insert_task(options, task, source.fetch(task)).rows
    _freeze_worker_heap()


def _fetch_and_insert_arrow(
    source: SliceSource, options: ClickHouseOptions, batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """`_fetch_and_insert` for `mapInArrow`: the task ids are the range values."""
    for task, rows in _fetch_and_insert(source, options, _slice_ids(batches)):
        yield _report(task, rows)


def _fetch(source: SliceSource, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Executor side: the rows of slice `i` (the range value) as Arrow batches."""
    for task in _slice_ids(batches):
        yield from source.fetch(task)


def _insert_partition(
    options: ClickHouseOptions, batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """Executor side, after a transform: insert this Spark partition as its task."""
    from pyspark import TaskContext

    context = TaskContext.get()
    assert context is not None
    task = context.partitionId()
    yield _report(task, insert_task(options, task, batches).rows)
    _freeze_worker_heap()


def _is_connect(spark: SparkSession) -> bool:
    """Whether `spark` is a Spark Connect session (which has no RDD API)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def _spark_compatible(table: pa.Table) -> pa.Table:
    """`table` cast to the exact Arrow types Spark uses for its columns."""
    from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema

    widened = pa.schema(
        [pa.field(f.name, spark_arrow_type(f.type), f.nullable) for f in table.schema]
    )
    return table.cast(to_arrow_schema(from_arrow_schema(widened)))


class _BlockWrite:
    """One block's task slices, offered to the tasks of `write` until `close`."""

    def __init__(
        self, spark: SparkSession, table: pa.Table, target: FlushTarget, tasks: Sequence[FlushTask]
    ) -> None:
        self.spark = spark
        self.target = target
        self.transform: Transform | None = (
            load_transform(target.transform) if target.transform else None
        )
        if self.transform is not None:
            table = _spark_compatible(table)
        self.schema = table.schema
        self.tasks = tuple(tasks)
        host, bind = handoff_address(spark)
        slices = [table.slice(t.start, t.rows) for t in self.tasks]
        self.handoff = SliceHandoff(host, slices, bind, target.handoff)

    def close(self) -> None:
        self.handoff.close()

    def write(self, replica: Replica) -> list[tuple[int, int]]:
        """``(task, rows)`` for every task, written to `replica`; HandoffTrustError, as the
        task raised it, when a task does not trust the handoff's certificate."""
        try:
            return self._write(replica)
        except Exception as exc:
            untrusted = HandoffTrustError.quoted_in(str(exc))
            if untrusted is None:
                raise
            raise untrusted from exc

    def _write(self, replica: Replica) -> list[tuple[int, int]]:
        options = ClickHouseOptions(
            hosts=((replica.host, replica.port),),
            database=self.target.database,
            table=self.target.table,
            connection=self.target.connection,
            token_prefix=self.target.token_prefix,
            task_tokens=tuple(f"{self.target.token_prefix}:{t.key}" for t in self.tasks),
        )
        count = len(self.tasks)
        source = self.handoff.source
        if self.transform is None and not _is_connect(self.spark):
            # An RDD job: the same work as the DataFrame job below without its planning and
            # Arrow round trips, 30-40 ms less per flush. Partition i holds exactly i.
            insert = functools.partial(_fetch_and_insert, source, options)
            ids = self.spark.sparkContext.parallelize(range(count), count)
            return [(int(task), int(rows)) for task, rows in ids.mapPartitions(insert).collect()]
        # Partition i of range(count) in count partitions holds exactly the value i.
        task_ids = self.spark.range(0, count, 1, count)
        if self.transform is None:
            insert_arrow = functools.partial(_fetch_and_insert_arrow, source, options)
            df = task_ids.mapInArrow(insert_arrow, _REPORT_SCHEMA)
        else:
            from pyspark.sql.pandas.types import from_arrow_schema

            block_df = task_ids.mapInArrow(
                functools.partial(_fetch, source), from_arrow_schema(self.schema)
            )
            out = self.transform(block_df)
            check_partitioning(out, f"transform {self.target.transform!r}")
            df = out.mapInArrow(functools.partial(_insert_partition, options), _REPORT_SCHEMA)
        return [(int(row[0]), int(row[1])) for row in df.collect()]


def flush(
    spark: SparkSession,
    block_id: str,
    table: pa.Table,
    target: FlushTarget,
    tasks: Sequence[FlushTask],
) -> FlushResult:
    """Write the `tasks` of a block (slices of its sorted rows `table`) to one writable
    replica of `target`; returns once ClickHouse acknowledged every task. Tasks without rows
    are not sent. Raises `FlushError`, `NoWritableReplicaError`, `ReplicasExhaustedError`,
    `TransformError`, `HandoffPortsError` (no free port in ``target.handoff.ports``) or
    `HandoffTrustError` (a task does not trust the handoff's certificate); a raised flush
    may have written some tasks, and flushing the same tasks again completes it without
    duplicates."""
    started = time.monotonic()
    tasks = [t for t in tasks if t.rows]
    if not tasks:
        return FlushResult(block_id, 0, 0, None, time.monotonic() - started, 0)
    write = _BlockWrite(spark, table, target, tasks)
    try:
        failover = Failover(target.connection, target.retry, fatal=(HandoffTrustError,))
        reports, replica, attempts = failover.run(target.replicas, write.write)
    finally:
        write.close()
    ran = sorted(task for task, _ in reports)
    if ran != list(range(len(tasks))):
        raise FlushError(f"block {block_id}: expected tasks 0..{len(tasks) - 1}, Spark ran {ran}")
    rows = sum(count for _, count in reports)
    expected = sum(t.rows for t in tasks)
    if write.transform is None and rows != expected:
        raise FlushError(f"block {block_id}: inserted {rows} of {expected} rows")
    result = FlushResult(
        block_id, rows, len(tasks), replica.name, time.monotonic() - started, attempts
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


def flush_block(spark: SparkSession, block: FlushBlock, target: FlushTarget) -> FlushResult:
    """`flush` a block cut into tasks of about ``target.rows_per_task`` rows (see
    `plan.plan_tasks`): the same block always gives the same tasks and tokens."""
    table = sorted_rows(block.to_table(), f"block {block.block_id}")
    ranges = plan_tasks(table, bounds_of(table), target.rows_per_task)
    slices = cut(table, ranges, f"block {block.block_id}")
    tasks = [FlushTask(r.key, start, n) for r, (start, n) in zip(ranges, slices, strict=True)]
    return flush(spark, block.block_id, table, target, tasks)
