"""spark_bridge: the long-lived SparkSession, the flush of sealed Arrow blocks into ClickHouse
with deterministic, deduplicated Spark tasks, and the ``hakafka_clickhouse`` Spark data source.

Names are imported on first use (PEP 562): ``spark_bridge.tables``, ``.connection``,
``.replicas``, ``.cluster`` and ``.runtime`` load no pyspark, so a command that only creates
tables or reads settings never pays for Spark. ``datasource``, ``flush`` and ``reader``
import pyspark.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from spark_bridge.cluster import Cluster, LiveBuffer, ShardReplicas
    from spark_bridge.connection import Connection
    from spark_bridge.datasource import ClickHouseDataSource, ClickHouseOptions
    from spark_bridge.flush import (
        FlushBlock,
        FlushError,
        FlushResult,
        FlushTarget,
        flush,
        flush_block,
    )
    from spark_bridge.handoff import (
        HandoffOptions,
        HandoffPortsError,
        HandoffTls,
        HandoffTrustError,
        PortRange,
    )
    from spark_bridge.plan import FlushTask, PlanError, TaskRange
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

# Each public name and the submodule that defines it.
_SOURCES = {
    "Cluster": "cluster",
    "LiveBuffer": "cluster",
    "ShardReplicas": "cluster",
    "Connection": "connection",
    "ClickHouseDataSource": "datasource",
    "ClickHouseOptions": "datasource",
    "FlushBlock": "flush",
    "FlushError": "flush",
    "FlushResult": "flush",
    "FlushTarget": "flush",
    "FlushTask": "plan",
    "flush": "flush",
    "flush_block": "flush",
    "HandoffOptions": "handoff",
    "HandoffPortsError": "handoff",
    "HandoffTls": "handoff",
    "HandoffTrustError": "handoff",
    "PortRange": "handoff",
    "PlanError": "plan",
    "TaskRange": "plan",
    "read_table": "reader",
    "NoWritableReplicaError": "replicas",
    "Replica": "replicas",
    "ReplicasExhaustedError": "replicas",
    "RetryPolicy": "replicas",
    "SparkRuntime": "runtime",
    "SparkSettings": "runtime",
    "prepare_session": "runtime",
    "Engine": "tables",
    "SchemaMismatchError": "tables",
    "TableSpec": "tables",
    "ensure_table": "tables",
    "TransformError": "transform",
    "load_transform": "transform",
}

__all__ = [
    "ClickHouseDataSource",
    "ClickHouseOptions",
    "Cluster",
    "Connection",
    "Engine",
    "FlushBlock",
    "FlushError",
    "FlushResult",
    "FlushTarget",
    "FlushTask",
    "HandoffOptions",
    "HandoffPortsError",
    "HandoffTls",
    "HandoffTrustError",
    "LiveBuffer",
    "NoWritableReplicaError",
    "PlanError",
    "PortRange",
    "Replica",
    "ReplicasExhaustedError",
    "RetryPolicy",
    "SchemaMismatchError",
    "ShardReplicas",
    "SparkRuntime",
    "SparkSettings",
    "TableSpec",
    "TaskRange",
    "TransformError",
    "ensure_table",
    "flush",
    "flush_block",
    "load_transform",
    "prepare_session",
    "read_table",
]


if not TYPE_CHECKING:  # mypy reads the imports above, and rejects a name not among them

    def __getattr__(name: str) -> Any:
        source = _SOURCES.get(name)
        if source is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{__name__}.{source}"), name)
        globals()[name] = value
        return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


class _Package(types.ModuleType):
    """`spark_bridge.flush` is the function, as it was when this package imported everything:
    importing the submodule of the same name sets the package attribute to the module, which
    would shadow the function here."""

    def __setattr__(self, name: str, value: object) -> None:
        if name == "flush" and isinstance(value, types.ModuleType):
            value = value.flush
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
