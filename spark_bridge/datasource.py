"""The ``hakafka_clickhouse`` data source for Spark's Python Data Source API: the source
(its name, the schema a read gives) and its writer; the reader is `source_reader`'s, the
options `source_options`'.

Not named ``clickhouse``: that is the official ClickHouse Spark connector's source, and Spark
refuses or shadows a second source of one name (SPARK-46522, SPARK-50426).

The writer inserts each task's rows as one request, deduplicated by its token
(``token_prefix``), every insert with `DEDUP_INSERT_SETTINGS`.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage

from chlib.clients import ClientPool, worker_pool
from spark_bridge.source_options import ClickHouseOptions, parse_hosts
from spark_bridge.source_reader import READ_SETTINGS, ClickHouseReader, select_list

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

# `ClickHouseOptions` and `parse_hosts` too: the flush and `read_table` take them from here.
__all__ = [
    "DEDUP_INSERT_SETTINGS",
    "SOURCE_NAME",
    "ClickHouseDataSource",
    "ClickHouseOptions",
    "ClickHouseWriter",
    "TaskInserted",
    "arrow_file",
    "insert_settings",
    "insert_task",
    "parse_hosts",
    "spark_arrow_type",
]

SOURCE_NAME = "hakafka_clickhouse"
# Sent with every insert, over whatever the user's profile or the server sets: a block is
# deduplicated (`insert_deduplicate`; from ClickHouse 26 `deduplicate_insert` overrides it)
# and written by the INSERT itself, not buffered and merged with other clients' rows into
# other blocks (`async_insert`).
DEDUP_INSERT_SETTINGS: Mapping[str, int | str] = {
    "insert_deduplicate": 1,
    "deduplicate_insert": "enable",
    "async_insert": 0,
}
# Pinned only where the server has them: an older server refuses an unknown setting.
_NEWER_SETTINGS = frozenset({"deduplicate_insert"})


@dataclass
class TaskInserted(WriterCommitMessage):
    """What one write task inserted (rows) under which deduplication token."""

    task: int
    rows: int
    token: str | None


def insert_settings(server_settings: Container[str], token: str | None) -> dict[str, int | str]:
    """The settings of one insert: `DEDUP_INSERT_SETTINGS` (the newer ones only if they are in
    `server_settings`, the names the server has) and the deduplication token, if any."""
    settings = {
        name: value
        for name, value in DEDUP_INSERT_SETTINGS.items()
        if name not in _NEWER_SETTINGS or name in server_settings
    }
    if token:
        settings["insert_deduplication_token"] = token
    return settings


def insert_task(
    options: ClickHouseOptions,
    task: int,
    batches: Iterable[pa.RecordBatch],
    pool: ClientPool | None = None,
) -> TaskInserted:
    """Insert all of one task's `batches` as ONE request (one token, one ClickHouse block),
    with a client of `pool` (default: this process's `worker_pool`).

    The rows go as one Arrow record batch, however they came: ClickHouse (26) derives the
    deduplication ids of an insert from its token AND its input chunks, so the same rows
    with the same token but cut into other batches (a re-flush rebuilt from the WAL) would
    not be recognized as the same insert."""
    batch_list = list(batches)
    if not batch_list:
        return TaskInserted(task, 0, options.token(task))
    data = pa.Table.from_batches(batch_list).combine_chunks()
    token = options.token(task)
    with (pool or worker_pool()).client(options.connection, options.hosts, options.database) as c:
        settings = insert_settings(c.server_settings, token)
        body = arrow_file(data, c.write_compression)
        c.raw_insert(
            options.qualified_table, data.schema.names, body, settings=settings, fmt="Arrow"
        )
    return TaskInserted(task, data.num_rows, token)


def arrow_file(data: pa.Table, compression: str | None) -> pa.Buffer:
    """`data` as an Arrow IPC file (what clickhouse-connect's `insert_arrow` sends, its
    buffers compressed with `compression` if that is "lz4" or "zstd"), written once into a
    buffer of exactly its size. `insert_arrow` grows its buffer by doubling: a Spark worker
    faulted in fresh pages at every step, 0.37 s of CPU for 95 MiB against 0.025 s here."""
    options = (
        pa.ipc.IpcWriteOptions(compression=compression) if compression in ("lz4", "zstd") else None
    )

    def write(sink: pa.NativeFile) -> None:
        with pa.ipc.new_file(sink, data.schema, options=options) as writer:
            writer.write_table(data)

    size = pa.MockOutputStream()
    write(size)
    body = pa.allocate_buffer(size.size())
    write(pa.FixedSizeBufferWriter(body))
    return body


class ClickHouseWriter(DataSourceArrowWriter):
    """What Spark runs in each write task: its rows inserted by `insert_task`, the task's
    number its partition's."""

    def __init__(self, options: ClickHouseOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TaskInserted:
        from pyspark import TaskContext

        context = TaskContext.get()
        task = context.partitionId() if context is not None else 0
        return insert_task(self.options, task, iterator)


def spark_arrow_type(arrow_type: pa.DataType) -> pa.DataType:
    """The Arrow type Spark can take for ClickHouse's `arrow_type` (unsigned -> wider signed)."""
    widen = {
        pa.uint8(): pa.int16(),
        pa.uint16(): pa.int32(),
        pa.uint32(): pa.int64(),
        pa.uint64(): pa.decimal128(20, 0),
        pa.large_string(): pa.string(),
        pa.large_binary(): pa.binary(),
    }
    if pa.types.is_dictionary(arrow_type):
        return spark_arrow_type(arrow_type.value_type)
    if pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type):
        return pa.list_(spark_arrow_type(arrow_type.value_type))
    if pa.types.is_map(arrow_type):
        return pa.map_(
            spark_arrow_type(arrow_type.key_type), spark_arrow_type(arrow_type.item_type)
        )
    if pa.types.is_struct(arrow_type):
        return pa.struct(
            [pa.field(f.name, spark_arrow_type(f.type), f.nullable) for f in arrow_type]
        )
    if pa.types.is_fixed_size_binary(arrow_type):
        return pa.binary()
    return widen.get(arrow_type, arrow_type)


class ClickHouseDataSource(DataSource):
    """``spark.read.format("hakafka_clickhouse")`` / ``df.write.format(...)`` alike."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> StructType:
        from pyspark.sql.pandas.types import from_arrow_schema

        options = ClickHouseOptions.parse(self.options)
        client = options.client(options.shards[0])
        try:
            empty = client.query_arrow(
                f"SELECT {select_list(client, options)} FROM {options.qualified_table} LIMIT 0",
                settings=READ_SETTINGS,
            )
        finally:
            client.close()
        fields = [pa.field(f.name, spark_arrow_type(f.type), f.nullable) for f in empty.schema]
        return from_arrow_schema(pa.schema(fields))

    def reader(self, schema: StructType) -> ClickHouseReader:
        return ClickHouseReader(ClickHouseOptions.parse(self.options), schema)

    def writer(self, schema: StructType, overwrite: bool) -> ClickHouseWriter:
        if overwrite:
            raise ValueError(f"the {SOURCE_NAME} data source only appends (use mode 'append')")
        return ClickHouseWriter(ClickHouseOptions.parse(self.options))
