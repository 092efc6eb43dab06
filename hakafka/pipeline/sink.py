"""Where a pipeline's blocks go: its two ClickHouse tables, the shard's replicas, the flush.

`PipelineSink` flushes a `PipelineBlock` through Spark: first its rows into `<table>`, then
its dead letters into `<table>_dead_letter`, both with deduplication tokens
`<pipeline>:<block id>:<task>`, so a re-flush of the same block (by this node or the next
leader) adds nothing twice.
"""

from __future__ import annotations

from collections.abc import Callable

from clickhouse_connect.driver.client import Client
from pyspark.sql import SparkSession

from hakafka.config import Config, PipelineConfig
from hakafka.consumer import PipelineSchema
from hakafka.pipeline.buffer import PipelineBlock
from hakafka.pipeline.parts import Flushed
from hakafka.settings import connection_of, table_specs
from spark_bridge.flush import FlushTarget, flush
from spark_bridge.replicas import Replica
from spark_bridge.tables import TableSpec, ensure_table


class PipelineSink:
    """Flushes the blocks of one pipeline of one shard through the node's Spark session."""

    def __init__(
        self,
        config: Config,
        pipeline: PipelineConfig,
        schema: PipelineSchema,
        spark: Callable[[], SparkSession],
    ) -> None:
        self._pipeline = pipeline
        self._rows_per_task = config.spark.rows_per_task
        self._spark = spark
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

    def flush(self, block: PipelineBlock, replicas: tuple[Replica, ...]) -> Flushed:
        """Write the block's rows and dead letters; returns once ClickHouse acknowledged both."""
        spark = self._spark()
        rows = flush(
            spark,
            block.rows,
            self._target(self.rows_spec, replicas, self._pipeline.transform or None),
        )
        dead = 0
        if block.dead_letters is not None:
            dead = flush(
                spark, block.dead_letters, self._target(self.dead_spec, replicas, None)
            ).rows
        return Flushed(rows=rows.rows, dead_letters=dead, replica=rows.replica)

    def _target(
        self, spec: TableSpec, replicas: tuple[Replica, ...], transform: str | None
    ) -> FlushTarget:
        return FlushTarget(
            database=spec.database,
            table=spec.table,
            replicas=replicas,
            token_prefix=self._pipeline.name,
            connection=self.connection,
            transform=transform,
            rows_per_task=self._rows_per_task,
        )
