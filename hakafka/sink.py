"""Where a pipeline's blocks go: its two ClickHouse tables, the shard's replicas, the flush.

`PipelineSink` turns the config into spark_bridge's terms (TableSpec, Replica, FlushTarget)
and flushes a `PipelineBlock`: first its rows into `<table>`, then its dead letters into
`<table>_dead_letter`, both with deduplication tokens `<pipeline>:<block id>:<task>`, so a
re-flush of the same block (by this node or the next leader) adds nothing twice.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from clickhouse_connect.driver.client import Client
from pyspark.sql import SparkSession

from hakafka.config import Config, PipelineConfig
from hakafka.consumer import DEAD_LETTER_COLUMNS, PipelineSchema
from hakafka.pipeline_buffer import PipelineBlock
from spark_bridge import flush
from spark_bridge.connection import Connection
from spark_bridge.flush import FlushResult, FlushTarget
from spark_bridge.replicas import Replica
from spark_bridge.tables import Engine, TableSpec, ensure_table

DEAD_LETTER_ORDER_BY = "(_partition, _offset)"


@dataclass(frozen=True)
class SinkResult:
    rows: FlushResult
    dead_letters: FlushResult | None


def connection_of(config: Config) -> Connection:
    ch = config.clickhouse
    return Connection(
        user=ch.user,
        password=ch.password.value,
        secure=ch.secure,
        verify=ch.verify,
        connect_timeout=min(10.0, ch.insert_timeout),
    )


def table_specs(
    config: Config, pipeline: PipelineConfig, schema: PipelineSchema
) -> tuple[TableSpec, TableSpec]:
    """The target table and the dead-letter table of `pipeline`."""
    ch = config.clickhouse
    engine = Engine(ch.engine)
    rows = TableSpec(
        database=ch.database,
        table=pipeline.table,
        columns=tuple(schema.clickhouse_columns()),
        order_by=pipeline.order_by,
        partition_by=pipeline.partition_by or None,
        ttl=pipeline.ttl or None,
        engine=engine,
        dedup_window=ch.dedup_window,
    )
    dead = TableSpec(
        database=ch.database,
        table=pipeline.dead_letter_table,
        columns=tuple(DEAD_LETTER_COLUMNS),
        order_by=DEAD_LETTER_ORDER_BY,
        engine=engine,
        dedup_window=ch.dedup_window,
    )
    return rows, dead


def shard_replicas(
    config: Config, shard: int, writable: Callable[[Mapping[str, str]], Mapping[str, str]]
) -> tuple[Replica, ...]:
    """The shard's ClickHouse replicas; `writable` filters out nodes under replacement."""
    endpoints = config.clickhouse.replicas.get(shard, {})
    allowed = writable({node: str(ep) for node, ep in endpoints.items()})
    return tuple(
        Replica(
            name=node,
            host=ep.host,
            port=ep.port,
            local=node == config.node,
            writable=node in allowed,
        )
        for node, ep in sorted(endpoints.items())
    )


class PipelineSink:
    """Flushes the blocks of one pipeline of one shard."""

    def __init__(self, config: Config, pipeline: PipelineConfig, schema: PipelineSchema) -> None:
        self.config = config
        self.pipeline = pipeline
        self.rows_spec, self.dead_spec = table_specs(config, pipeline, schema)
        self.connection = connection_of(config)

    def ensure_tables(self, replicas: tuple[Replica, ...]) -> None:
        """Create both tables on every writable replica if missing; SchemaMismatchError if a
        table exists with other columns."""
        for replica in replicas:
            if not replica.writable:
                continue
            client: Client = self.connection.client(replica.host, replica.port)
            try:
                ensure_table(client, self.rows_spec)
                ensure_table(client, self.dead_spec)
            finally:
                client.close()

    def flush(
        self, spark: SparkSession, block: PipelineBlock, replicas: tuple[Replica, ...]
    ) -> SinkResult:
        """Write the block's rows and dead letters; returns once ClickHouse acknowledged both."""
        rows = flush(
            spark,
            block.rows,
            self._target(self.rows_spec, replicas, self.pipeline.transform or None),
        )
        dead = None
        if block.dead_letters is not None:
            dead = flush(spark, block.dead_letters, self._target(self.dead_spec, replicas, None))
        return SinkResult(rows, dead)

    def _target(
        self, spec: TableSpec, replicas: tuple[Replica, ...], transform: str | None
    ) -> FlushTarget:
        return FlushTarget(
            database=spec.database,
            table=spec.table,
            replicas=replicas,
            token_prefix=self.pipeline.name,
            connection=self.connection,
            transform=transform,
            rows_per_task=self.config.spark.rows_per_task,
        )
