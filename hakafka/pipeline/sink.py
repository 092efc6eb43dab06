"""Where a pipeline's blocks go: its two ClickHouse tables, the shard's replicas, the flush.

`PipelineSink` flushes a `PlannedBlock` through Spark: first its rows into `<table>`, then
its dead letters into `<table>_dead_letter`, each task with the deduplication token
`<pipeline>:<task key>` (the key names the task's offsets, see `blockplan`), so a re-flush of
the same tasks (by this node or the next leader) adds nothing twice.
"""

from __future__ import annotations

from collections.abc import Callable

from clickhouse_connect.driver.client import Client
from pyspark.sql import SparkSession

from hakafka.config import Config, PipelineConfig
from hakafka.consumer import PipelineSchema
from hakafka.pipeline.blockplan import PlannedBlock
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

    def flush(self, block: PlannedBlock, replicas: tuple[Replica, ...]) -> Flushed:
        """Write the block's rows and dead letters; returns once ClickHouse acknowledged both."""
        spark, sealed = self._spark(), block.block
        rows = flush(
            spark,
            sealed.block_id,
            sealed.rows.table,
            self._target(self.rows_spec, replicas, self._pipeline.transform or None),
            block.rows,
        )
        dead = 0
        if sealed.dead_letters is not None:
            target = self._target(self.dead_spec, replicas, None)
            dead = flush(spark, sealed.block_id, sealed.dead_letters.table, target, block.dead).rows
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
        )
