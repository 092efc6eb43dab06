"""Real Spark: a DataFrame from a pyarrow Table, written by a Python data source whose
executors insert Arrow batches into the ClickHouse front."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pytest
from pyspark import cloudpickle
from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from devstack.clickhouse import ClickHouseService

pytestmark = [pytest.mark.integration, pytest.mark.spark]

# Executors' Python workers cannot import test modules: ship this module's classes by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


@dataclass
class Inserted(WriterCommitMessage):
    partition: int
    rows: int


class SmokeWriter(DataSourceArrowWriter):
    def __init__(self, options: dict[str, str]) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Inserted:
        import clickhouse_connect
        from pyspark import TaskContext

        context = TaskContext.get()
        partition = context.partitionId() if context else -1
        client = clickhouse_connect.get_client(
            host="127.0.0.1", port=int(self.options["port"]), database=self.options["database"]
        )
        rows = 0
        try:
            for batch in iterator:
                client.insert_arrow(self.options["table"], pa.Table.from_batches([batch]))
                rows += batch.num_rows
        finally:
            client.close()
        return Inserted(partition, rows)


class SmokeSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "hakafka_smoke_clickhouse"

    def writer(self, schema: StructType, overwrite: bool) -> SmokeWriter:
        return SmokeWriter(dict(self.options))


def test_arrow_dataframe_written_by_executors(
    spark: SparkSession, clickhouse: ClickHouseService, ch_database: str, ch_client: Any
) -> None:
    rows = 50_000
    ch_client.command("CREATE TABLE events (id Int64, name String) ENGINE = MergeTree ORDER BY id")
    table = pa.table(
        {"id": pa.array(range(rows), pa.int64()), "name": [f"n{i % 7}" for i in range(rows)]}
    )
    df = spark.createDataFrame(table).repartition(4)
    assert df.count() == rows
    spark.dataSource.register(SmokeSource)
    (
        df.write.format("hakafka_smoke_clickhouse")
        .mode("append")
        .option("port", str(clickhouse.port))
        .option("database", ch_database)
        .option("table", "events")
        .save()
    )
    result = ch_client.query(
        "SELECT count(), uniqExact(id), min(id), max(id) FROM events"
    ).result_rows
    assert result == [(rows, rows, 0, rows - 1)]
