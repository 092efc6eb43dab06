"""The one place that turns a `Config` into each library's settings.

ZooKeeper (`ZkConfig`), decoding (`PipelineSchema`, `DecodeOptions`, a fresh decoder),
ClickHouse (`Connection`, the `TableSpec`s of a pipeline, a shard's `Replica`s), Spark
(`SparkSettings`, the flush handoff's `HandoffOptions`), the buffer's flush `Thresholds` and
the directory of a pipeline's WAL. The daemon, the pipeline and the operator commands all
build their libraries' objects from here. Nothing here imports pyspark: `chlib` does not,
nor do `spark_bridge.handoff` and `.runtime`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path

from buffer import Thresholds
from buffer.limits import QueryLimits, ServerLimits
from buffer.tls import ClientTls, ServerTls
from chlib.connection import Connection
from chlib.replicas import Replica
from chlib.tables import TableSpec
from hakafka.config import Config, PipelineConfig, advertised_host
from hakafka.consumer import (
    DEAD_LETTER_COLUMNS,
    DecodeOptions,
    Decoder,
    PipelineSchema,
    ShardAssignment,
    make_decoder,
)
from hakafka.consumer.registry import RegistrySettings
from hakafka.coordination import ZkConfig, ZkTls
from spark_bridge.handoff import HandoffOptions, HandoffTls, PortRange
from spark_bridge.runtime import SparkSettings

DEAD_LETTER_ORDER_BY = "(_partition, _offset)"


# -- ZooKeeper and Spark ---------------------------------------------------------------------


def zk_config(config: Config) -> ZkConfig:
    z = config.zookeeper
    return ZkConfig(
        hosts=z.hosts,
        root=z.root,
        session_timeout_s=z.session_timeout,
        connect_timeout_s=z.connect_timeout,
        request_timeout_s=z.request_timeout,
        auth=(z.auth_user, z.auth_password.value) if z.auth_user else None,
        require_acl=z.require_acl,
        tls=ZkTls(z.ca_file or None, z.cert_file or None, z.key_file or None) if z.tls else None,
    )


def spark_settings(config: Config) -> SparkSettings:
    s = config.spark
    return SparkSettings(
        master=s.master,
        remote=s.remote or None,
        app_name=f"hakafka-{config.node}",
        driver_memory=s.driver_memory,
        conf=dict(s.conf),
        handoff_host=s.handoff_host or None,
        handoff_bind=s.handoff_bind or None,
    )


def handoff_options(config: Config) -> HandoffOptions:
    """How the flushes' slice handoff serves: on a port of `[spark] handoff_ports` (errors
    name the key), and over TLS with the node's `[server]` certificate when it has one, which
    the tasks verify against `tls_ca_file` (else their system's CAs) for the node's advertised
    host, the name that certificate carries."""
    s, server = config.spark, config.server
    tls = None
    if server.tls_cert_file:
        tls = HandoffTls(
            cert_file=Path(server.tls_cert_file),
            key_file=Path(server.tls_key_file),
            ca_file=Path(server.tls_ca_file) if server.tls_ca_file else None,
            server_name=advertised_host(server, server.flight).strip("[]"),
        )
    ports = PortRange.parse(s.handoff_ports, "spark.handoff_ports") if s.handoff_ports else None
    return HandoffOptions(ports=ports, tls=tls)


# -- decoding ------------------------------------------------------------------------------


def pipeline_schema(pipeline: PipelineConfig) -> PipelineSchema:
    return PipelineSchema.of(
        [(c.name, c.clickhouse_type) for c in pipeline.columns],
        pipeline.meta_columns,
        {c.name: c.path for c in pipeline.columns if c.path},
    )


def decode_options(pipeline: PipelineConfig) -> DecodeOptions:
    return DecodeOptions(
        on_error=pipeline.on_error,
        max_message_bytes=pipeline.max_message_bytes,
        dead_letter_bytes=pipeline.dead_letter_bytes,
    )


def registry_of(config: Config) -> RegistrySettings | None:
    """The `[schema_registry]` the pipelines' writer schemas come from (None: not set)."""
    r = config.schema_registry
    if not r.url:
        return None
    return RegistrySettings(r.url, r.user, r.password.value, r.ca_file, r.timeout)


def decoder_of(
    pipeline: PipelineConfig, schema: PipelineSchema, registry: RegistrySettings | None = None
) -> Decoder:
    """A fresh decoder of `pipeline` (one per leadership term; its schema cache with it)."""
    return make_decoder(
        pipeline.format,
        schema,
        decode_options(pipeline),
        registry=None if pipeline.schema_file else registry,
        schema_file=Path(pipeline.schema_file) if pipeline.schema_file else None,
    )


def lane_count(pipeline: PipelineConfig, cores: int | None = None) -> int:
    """The most lanes a term of `pipeline` reads with: its `lanes`, or for "auto" the host's
    cores capped by `lanes_max` (a shard owning fewer partitions gets fewer)."""
    if isinstance(pipeline.lanes, int):
        return pipeline.lanes
    return max(1, min(cores or os.cpu_count() or 1, pipeline.lanes_max))


# -- buffer and WAL ------------------------------------------------------------------------


def server_limits(config: Config) -> ServerLimits:
    """The `[server]` bounds on each client of the HTTP and Flight query servers."""
    s = config.server
    return ServerLimits(
        max_request_bytes=s.max_request_bytes,
        request_timeout=s.request_timeout,
        max_connections=s.max_connections,
        max_concurrent_queries=s.max_concurrent_queries,
    )


def query_limits(config: Config) -> QueryLimits:
    """The `[server]` bounds on each query of the SQL engine; spilling (when
    `max_spill_bytes` > 0) goes to `<data_dir>/query-spill`, never the working directory."""
    s = config.server
    return QueryLimits(
        timeout_s=s.query_timeout,
        max_rows=s.max_result_rows,
        max_result_bytes=s.max_result_bytes,
        memory_bytes=s.query_memory_bytes,
        threads=s.query_threads,
        max_spill_bytes=s.max_spill_bytes,
        spill_dir=str(config.data_dir / "query-spill") if s.max_spill_bytes else "",
    )


def server_tls(config: Config) -> ServerTls | None:
    """The query servers' certificate and key, or None when `[server]` serves plain text."""
    s = config.server
    return ServerTls(Path(s.tls_cert_file), Path(s.tls_key_file)) if s.tls_cert_file else None


def client_tls(config: Config) -> ClientTls | None:
    """How forwarding and the ops commands check nodes: None (any URL) unless `[server]`
    sets a TLS key; then TLS only, verified against `tls_ca_file` or the system's CAs."""
    s = config.server
    if not (s.tls_cert_file or s.tls_ca_file):
        return None
    return ClientTls(Path(s.tls_ca_file) if s.tls_ca_file else None)


def thresholds_of(pipeline: PipelineConfig) -> Thresholds:
    b = pipeline.buffer
    return Thresholds(
        min_rows=b.min_rows,
        max_rows=b.max_rows,
        min_bytes=b.min_bytes,
        max_bytes=b.max_bytes,
        min_age_s=b.min_age,
        max_age_s=b.max_age,
    )


def wal_dir(config: Config, shard: int, pipeline: str) -> Path:
    return config.data_dir / "wal" / str(shard) / pipeline


# -- ClickHouse ----------------------------------------------------------------------------


def connection_of(config: Config) -> Connection:
    ch = config.clickhouse
    return Connection(
        user=ch.user,
        password=ch.password.value,
        secure=ch.secure,
        verify=ch.verify,
        ca_cert=ch.ca_file or None,
        connect_timeout=min(10.0, ch.insert_timeout),
    )


def table_specs(
    config: Config, pipeline: PipelineConfig, schema: PipelineSchema
) -> tuple[TableSpec, TableSpec]:
    """The target table and the dead-letter table of `pipeline`."""
    ch = config.clickhouse
    rows = TableSpec(
        database=ch.database,
        table=pipeline.table,
        columns=tuple(schema.clickhouse_columns()),
        order_by=pipeline.order_by,
        partition_by=pipeline.partition_by or None,
        ttl=pipeline.ttl or None,
        engine=ch.engine,
        dedup_window=ch.dedup_window,
    )
    dead = TableSpec(
        database=ch.database,
        table=pipeline.dead_letter_table,
        columns=tuple(DEAD_LETTER_COLUMNS),
        order_by=DEAD_LETTER_ORDER_BY,
        engine=ch.engine,
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


def shard_assignment(config: Config, pipeline: PipelineConfig, shard: int) -> ShardAssignment:
    """Which partitions of the pipeline's topic `shard` consumes."""
    explicit = pipeline.partitions.get(shard) if pipeline.partitions else None
    return ShardAssignment(shard, config.shard_count, explicit)
