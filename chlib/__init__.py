"""chlib: plain ClickHouse code, no Spark. Tables (`TableSpec` and its DDL, creation, schema
and deduplication checks), ClickHouse type text (`chtypes`), how to reach a server
(`Connection`) and a pool of its clients (`clients`), the replicas of a shard to write to with
failover (`Replica`, `RetryPolicy`), and a cluster as a read sees it (`Cluster`).

Standalone: imports neither `hakafka` nor the other libraries but `retry_policy`, and never
pyspark, so the config, the operator commands and `spark_bridge` all build on it.
"""

from chlib.cluster import Cluster, LiveBuffer, ShardReplicas
from chlib.connection import Connection
from chlib.replicas import NoWritableReplicaError, Replica, ReplicasExhaustedError, RetryPolicy
from chlib.tables import Engine, SchemaMismatchError, TableSpec, UnsafeTableError, ensure_table

__all__ = [
    "Cluster",
    "Connection",
    "Engine",
    "LiveBuffer",
    "NoWritableReplicaError",
    "Replica",
    "ReplicasExhaustedError",
    "RetryPolicy",
    "SchemaMismatchError",
    "ShardReplicas",
    "TableSpec",
    "UnsafeTableError",
    "ensure_table",
]
