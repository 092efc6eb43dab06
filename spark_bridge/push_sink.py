"""The ``hakafka`` data source: ``df.write.format("hakafka")`` and
``df.writeStream.format("hakafka")`` push a DataFrame's rows into a pipeline's buffer on its
shards' leaders (`buffer.push_client.Pusher`: a 421 followed to the leader, a batch pushed
again across a failover until it is answered).

Options (strings): ``urls`` (comma list of node addresses, ``http://host:8300`` or
``grpc://host:8301``; any node of the cluster: a node that does not lead a shard names its
leader), ``pipeline``, ``writer`` (a name for this job's writers: the same when the job or
query is run again, so its batches are applied once; another one for another job),
``shards`` (how many the pipeline has; default 1), ``key`` (a column: a row goes to shard
crc32(its value as text) % shards; without it a task's rows go to shard task % shards),
``batch_rows`` (rows per pushed batch; default 100000), ``token``, ``wait_s`` (how long one
batch may take, retries included; default 300).

Identities. Task t's rows for shard s are writer ``<writer>-t<t>-s<s>``, cut into batches of
``batch_rows``; batch k of micro-batch b (the streaming query's batch id, which a restarted
query reuses for the batch it did not commit) is sequence ``b * 2**20 + k``, of a batch write
``k``. So a task run again (a retry, a restarted query) pushes the same (writer, sequence)
pairs and each is applied once, provided it holds the same rows: the source is replayable
and the query deterministic, as Spark's exactly-once sinks require.

Loads pyspark only in the classes Spark instantiates.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from buffer.push_bounds import MAX_ROWS
from buffer.push_client import Pushed, Pusher

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

SOURCE_NAME = "hakafka"
BATCH_ID_PROPERTY = "streaming.sql.batchId"  # the micro-batch's id, set on its tasks
TASK_BATCH_BITS = 20  # a micro-batch's batches: at most 2**20 per task and shard


@dataclass(frozen=True)
class PushOptions:
    """The data source's options, parsed once (ValueError names a missing or bad one)."""

    urls: tuple[str, ...]
    pipeline: str
    writer: str
    shards: int = 1
    key: str | None = None
    batch_rows: int = 100_000
    token: str | None = None
    wait_s: float = 300.0

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> PushOptions:
        opts = {str(k).lower(): str(v) for k, v in options.items()}
        for required in ("urls", "pipeline", "writer"):
            if not opts.get(required):
                raise ValueError(f"option {required!r} is required ({_HELP[required]})")
        urls = tuple(u.strip() for u in opts["urls"].split(",") if u.strip())
        bad = [u for u in urls if not u.startswith(("http://", "https://", "grpc"))]
        if bad:
            raise ValueError(f"option 'urls': {bad[0]!r} is not an http(s):// or grpc:// URL")
        return cls(
            urls=urls,
            pipeline=opts["pipeline"],
            writer=opts["writer"],
            shards=_positive(opts, "shards", 1),
            key=opts.get("key") or None,
            batch_rows=min(_positive(opts, "batch_rows", 100_000), MAX_ROWS),
            token=opts.get("token") or None,
            wait_s=float(_positive(opts, "wait_s", 300)),
        )


_HELP = {
    "urls": "comma list of node addresses, http://host:8300 or grpc://host:8301",
    "pipeline": "the pipeline whose buffer takes the rows",
    "writer": "a name for this job's writers, the same when it runs again",
}


def _positive(opts: Mapping[str, str], key: str, default: int) -> int:
    raw = opts.get(key)
    if raw is None:
        return default
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"option {key!r}: expected an integer >= 1, got {raw!r}")
    return int(raw)


@dataclass
class TaskPushed(WriterCommitMessage):
    """What one task pushed: rows applied, and batches answered as applied before."""

    rows: int
    duplicates: int


class BatchPusher(Protocol):
    """What pushes one writer's batches (`buffer.push_client.Pusher`)."""

    def push(self, sequence: int, batch: pa.Table) -> Pushed: ...

    def close(self) -> None: ...


def pusher_of(options: PushOptions, shard: int, writer: str) -> BatchPusher:
    """The `Pusher` of `writer` into `shard`."""
    return Pusher(
        lambda: options.urls,
        options.pipeline,
        shard,
        writer,
        token=options.token,
        wait_s=options.wait_s,
    )


def push_task(
    options: PushOptions,
    task: int,
    batch_id: int | None,
    batches: Iterator[pa.RecordBatch],
    make_pusher: Callable[[PushOptions, int, str], BatchPusher] = pusher_of,
) -> TaskPushed:
    """Push task `task`'s rows (see the module for the writer ids and sequences) through
    `make_pusher(options, shard, writer)`."""
    received = list(batches)
    rows = duplicates = 0
    table = pa.Table.from_batches(received) if received else None
    if table is None or table.num_rows == 0:
        return TaskPushed(0, 0)
    for shard, part in _by_shard(options, task, table):
        pusher = make_pusher(options, shard, f"{options.writer}-t{task}-s{shard}")
        try:
            for k, first in enumerate(range(0, part.num_rows, options.batch_rows)):
                sequence = k if batch_id is None else (batch_id << TASK_BATCH_BITS) + k
                answer = pusher.push(sequence, part.slice(first, options.batch_rows))
                rows += answer.rows
                duplicates += answer.duplicate
        finally:
            pusher.close()
    return TaskPushed(rows, duplicates)


def _by_shard(options: PushOptions, task: int, table: pa.Table) -> Iterator[tuple[int, pa.Table]]:
    """`table`'s rows per shard, in their order."""
    if options.key is None or options.shards == 1:
        yield task % options.shards, table
        return
    if options.key not in table.column_names:
        raise ValueError(f"option 'key': no column {options.key!r} (columns: {table.column_names})")
    values = table.column(options.key).cast(pa.string()).to_pylist()
    shards = pa.array(
        [0 if v is None else zlib.crc32(v.encode()) % options.shards for v in values], pa.int32()
    )
    for shard in range(options.shards):
        part = table.filter(pc.equal(shards, shard))
        if part.num_rows:
            yield shard, part


def _task_and_batch() -> tuple[int, int | None]:
    """This task's partition, and its micro-batch's id (None outside a streaming query)."""
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:
        return 0, None
    batch = context.getLocalProperty(BATCH_ID_PROPERTY)
    return context.partitionId(), None if batch is None else int(batch)


class PushWriter(DataSourceArrowWriter):
    """A batch write's task: its rows pushed, sequences from 0."""

    def __init__(self, options: PushOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TaskPushed:
        task, _ = _task_and_batch()
        return push_task(self.options, task, None, iterator)


class PushStreamWriter(DataSourceStreamArrowWriter):
    """A micro-batch's task: its rows pushed, sequences from the batch id."""

    def __init__(self, options: PushOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TaskPushed:
        task, batch = _task_and_batch()
        if batch is None:
            raise RuntimeError(f"no {BATCH_ID_PROPERTY} on a streaming task: cannot number it")
        return push_task(self.options, task, batch, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        """Nothing to commit: every batch was answered once flushed before its task ended."""

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        """Nothing to undo: what was pushed is pushed again, and applied once, by the retry."""


class PushDataSource(DataSource):
    """``df.write.format("hakafka")`` / ``df.writeStream.format("hakafka")``."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def writer(self, schema: StructType, overwrite: bool) -> PushWriter:
        if overwrite:
            raise ValueError(f"the {SOURCE_NAME} data source only appends (use mode 'append')")
        return PushWriter(PushOptions.parse(self.options))

    def streamWriter(self, schema: StructType, overwrite: bool) -> PushStreamWriter:  # noqa: N802
        if overwrite:
            raise ValueError(f"the {SOURCE_NAME} data source only appends (outputMode 'append')")
        return PushStreamWriter(PushOptions.parse(self.options))
