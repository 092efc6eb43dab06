"""`read_table`: a ClickHouse table as a Spark DataFrame through the ``hakafka_clickhouse``
source, every shard once, optionally with the rows still in the leaders' buffers."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from chlib.cluster import Cluster
from chlib.connection import Connection
from spark_bridge.datasource import (
    SOURCE_NAME,
    ClickHouseDataSource,
    ClickHouseOptions,
    parse_hosts,
    spark_arrow_type,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


def read_table(
    spark: SparkSession,
    table: str,
    *,
    hosts: Sequence[tuple[str, int]] | str | None = None,
    cluster: Cluster | None = None,
    database: str = "default",
    connection: Connection | None = None,
    columns: Sequence[str] | None = None,
    where: str | None = None,
    partition_by: str | None = None,
    partitions: int | None = None,
    lower_bound: int | None = None,
    upper_bound: int | None = None,
    include_buffer: bool = False,
    rng: random.Random | None = None,
) -> DataFrame:
    """`database.table` as a DataFrame read in parallel by Spark tasks, every shard once.

    Give `cluster` (every shard's replicas; `hakafka.ops.cluster_view` builds it from a
    hakafka config) or `hosts`, the replicas of a single shard (``[(host, port), ...]`` or
    ``"h1:8123,h2:8123"``). Each shard is read from one replica not under replacement, chosen
    at random per read (`rng`) and rotating over the shard's replicas across its tasks; a
    task whose replica fails reads the shard from the next one. `where` is a ClickHouse
    expression; Spark filters on the result are pushed down as well. Without `partition_by`
    there is one Spark partition per ClickHouse partition of each shard; with it,
    `partitions` ranges of that integer key per shard, with a stride from `lower_bound` and
    `upper_bound` (the key's min and max by default) as Spark's JDBC source cuts them.

    `include_buffer` (needs ``cluster.buffer``; not with `where`, which is ClickHouse SQL:
    filter the DataFrame instead) adds the rows the shard leaders hold and have not
    committed: the buffers are read first, then the checkpoint C, and the result is the
    ClickHouse rows below C plus the buffer rows at or above it, each (`_partition`,
    `_offset`) once (see DESIGN, spark_bridge reads).
    """
    if cluster is None:
        if hosts is None:
            raise ValueError("read_table needs `cluster` or `hosts`")
        cluster = Cluster.from_hosts([parse_hosts(hosts) if isinstance(hosts, str) else hosts])
    elif hosts is not None:
        raise ValueError("read_table takes `cluster` or `hosts`, not both")
    live = cluster.buffer if include_buffer else None
    if include_buffer:
        if live is None:
            raise ValueError("include_buffer needs a cluster with its leaders' buffers")
        if where is not None:
            raise ValueError(
                "include_buffer reads the buffers too, where `where` (ClickHouse SQL) cannot "
                "apply: filter the DataFrame instead"
            )
    # The buffers before the checkpoint: a block committed in between is then in ClickHouse
    # below C, and what the buffers dropped before being read is below C too.
    buffered = live.rows() if live is not None else None
    committed = live.checkpoint() if live is not None else None
    shards = cluster.read_order(rng or random.Random())
    options = ClickHouseOptions(
        hosts=shards[0],
        shard_hosts=shards,
        database=database,
        table=table,
        connection=connection or Connection(),
        columns=tuple(columns) if columns else None,
        where=where,
        committed_offsets=committed,
        partition_column=partition_by,
        num_partitions=partitions,
        lower_bound=lower_bound,
        upper_bound=upper_bound,
    )
    spark.dataSource.register(ClickHouseDataSource)
    flushed = spark.read.format(SOURCE_NAME).options(**options.to_options()).load()
    if buffered is None or committed is None:
        return flushed
    return flushed.unionByName(_buffer_frame(spark, flushed, buffered, committed))


def above_checkpoint(rows: pa.Table, checkpoint: Mapping[int, int]) -> pa.Table:
    """The rows of `rows` at or above `checkpoint` (partition -> next offset; a partition
    without one: all its rows)."""
    partitions = rows.column("_partition")
    floor = pc.fill_null(
        pc.take(
            pa.array(list(checkpoint.values()), pa.int64()),
            pc.index_in(partitions, value_set=pa.array(list(checkpoint), partitions.type)),
        ),
        0,
    )
    return rows.filter(pc.greater_equal(rows.column("_offset"), floor))


def _buffer_frame(
    spark: SparkSession, flushed: DataFrame, rows: pa.Table, checkpoint: Mapping[int, int]
) -> DataFrame:
    """The buffer rows above `checkpoint` as a DataFrame of `flushed`'s columns and types."""
    from pyspark.sql.pandas.types import to_arrow_schema

    schema = to_arrow_schema(flushed.schema, timezone="UTC")
    missing = [name for name in schema.names if name not in rows.column_names]
    if missing:
        raise ValueError(f"the buffer rows have no columns {missing} (read from ClickHouse)")
    fresh = above_checkpoint(rows, checkpoint).select(schema.names)
    converted = pa.table(
        [
            column.cast(spark_arrow_type(column.type)).cast(field.type)
            for column, field in zip(fresh.columns, schema, strict=True)
        ],
        schema=schema,
    )
    return spark.createDataFrame(converted, schema=flushed.schema)
