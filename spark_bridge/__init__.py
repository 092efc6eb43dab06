"""spark_bridge: the long-lived SparkSession, the flush of sealed Arrow blocks into ClickHouse
with deterministic, deduplicated Spark tasks, and the ``clickhouse`` Spark data source."""

from spark_bridge.connection import Connection
from spark_bridge.datasource import ClickHouseDataSource, ClickHouseOptions
from spark_bridge.flush import FlushBlock, FlushError, FlushResult, FlushTarget, flush
from spark_bridge.reader import read_table
from spark_bridge.replicas import (
    NoWritableReplicaError,
    Replica,
    ReplicasExhaustedError,
    RetryPolicy,
)
from spark_bridge.runtime import SparkRuntime, SparkSettings, prepare_session
from spark_bridge.tables import Engine, SchemaMismatchError, TableSpec, ensure_table
from spark_bridge.transform import TransformError, load_transform

__all__ = [
    "ClickHouseDataSource",
    "ClickHouseOptions",
    "Connection",
    "Engine",
    "FlushBlock",
    "FlushError",
    "FlushResult",
    "FlushTarget",
    "NoWritableReplicaError",
    "Replica",
    "ReplicasExhaustedError",
    "RetryPolicy",
    "SchemaMismatchError",
    "SparkRuntime",
    "SparkSettings",
    "TableSpec",
    "TransformError",
    "ensure_table",
    "flush",
    "load_transform",
    "prepare_session",
    "read_table",
]
