"""`read_table`: a ClickHouse table as a Spark DataFrame through the ``clickhouse`` source."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from spark_bridge.connection import Connection
from spark_bridge.datasource import (
    SOURCE_NAME,
    ClickHouseDataSource,
    ClickHouseOptions,
    parse_hosts,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


def read_table(
    spark: SparkSession,
    table: str,
    *,
    hosts: Sequence[tuple[str, int]] | str,
    database: str = "default",
    connection: Connection | None = None,
    columns: Sequence[str] | None = None,
    where: str | None = None,
    partition_by: str | None = None,
    partitions: int | None = None,
) -> DataFrame:
    """`database.table` as a DataFrame read in parallel by Spark tasks.

    `hosts` is ``[(host, port), ...]`` or ``"h1:8123,h2:8123"``; `where` is a ClickHouse
    expression; Spark filters on the result are pushed down as well. Without `partition_by`
    there is one Spark partition per ClickHouse partition; with it, `partitions` ranges of
    that integer key.
    """
    options = ClickHouseOptions(
        hosts=parse_hosts(hosts) if isinstance(hosts, str) else tuple(hosts),
        database=database,
        table=table,
        connection=connection or Connection(),
        columns=tuple(columns) if columns else None,
        where=where,
        partition_by=partition_by,
        partitions=partitions,
    )
    spark.dataSource.register(ClickHouseDataSource)
    return spark.read.format(SOURCE_NAME).options(**options.to_options()).load()
