"""The daemon's Prometheus metrics, created on one registry per daemon (no global state).

One label scheme: `pipeline`, `shard`, and `partition` where it applies (plus `result`,
`action` or `protocol` where a metric splits by outcome). The process, platform and GC
collectors of prometheus-client sit on the same registry (`process_resident_memory_bytes`...),
and `hakafka_build_info` carries the versions as labels (value 1).
"""

from __future__ import annotations

import platform
from dataclasses import dataclass
from importlib.metadata import version

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)

from hakafka import __version__
from hakafka.consumer import ConsumerMetrics

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


@dataclass(frozen=True)
class Metrics:
    registry: CollectorRegistry
    consumer: ConsumerMetrics
    consumed_rows: Counter
    pushed_rows: Counter
    push_copies: Counter
    consumed_bytes: Counter
    dead_letters: Counter
    wal_bytes: Counter
    wal_syncs: Counter
    wal_sync_seconds: Histogram
    buffer_rows: Gauge
    lane_rows: Counter
    lanes: Gauge
    buffer_bytes: Gauge
    buffer_limit_bytes: Gauge
    backpressure: Gauge
    flushes: Counter
    flush_rows: Counter
    flush_seconds: Histogram
    checkpoint_lag: Gauge
    stalled: Gauge
    pipeline_state: Gauge
    kafka_lag: Gauge
    leader: Gauge
    epoch: Gauge
    leader_changes: Counter
    leadership_corrections: Counter
    balance_moves: Counter
    zookeeper_connected: Gauge
    ready: Gauge
    flush_ready: Gauge
    queries: Counter
    query_seconds: Histogram

    @classmethod
    def create(cls, registry: CollectorRegistry | None = None) -> Metrics:
        reg = registry if registry is not None else CollectorRegistry()
        ProcessCollector(registry=reg)
        PlatformCollector(registry=reg)
        GCCollector(registry=reg)
        build = Gauge(
            "hakafka_build_info",
            "Versions of hakafka and of the libraries that decide its behaviour (value 1)",
            ["version", "python", "pyarrow", "pyspark"],
            registry=reg,
        )
        build.labels(
            version=__version__,
            python=platform.python_version(),
            pyarrow=version("pyarrow"),
            pyspark=version("pyspark"),
        ).set(1)
        p = ["pipeline", "shard"]
        return cls(
            registry=reg,
            consumer=ConsumerMetrics.create(reg),
            consumed_rows=Counter(
                "hakafka_consumed_rows", "Rows decoded from Kafka", p, registry=reg
            ),
            pushed_rows=Counter(
                "hakafka_pushed_rows",
                "Rows pushed into the buffer (POST /insert, Flight do_put), each applied once",
                p,
                registry=reg,
            ),
            push_copies=Counter(
                "hakafka_push_copies",
                "Pushed batches copied to the shard's other nodes before their answer "
                "(outcome: copied, as push_acks asks; short: too few nodes took it, the flush "
                "answers)",
                [*p, "outcome"],
                registry=reg,
            ),
            consumed_bytes=Counter(
                "hakafka_consumed_bytes", "Message value bytes consumed", p, registry=reg
            ),
            dead_letters=Counter(
                "hakafka_dead_letters", "Messages sent to the dead-letter table", p, registry=reg
            ),
            wal_bytes=Counter("hakafka_wal_bytes", "Bytes appended to the WAL", p, registry=reg),
            wal_syncs=Counter(
                "hakafka_wal_syncs", "WAL syncs (fdatasync) requested", p, registry=reg
            ),
            wal_sync_seconds=Histogram(
                "hakafka_wal_sync_seconds",
                "WAL append + sync latency",
                p,
                buckets=_LATENCY_BUCKETS,
                registry=reg,
            ),
            buffer_rows=Gauge(
                "hakafka_buffer_rows", "Rows held in the memory buffer", p, registry=reg
            ),
            lane_rows=Counter(
                "hakafka_lane_rows",
                "Rows decoded from Kafka by each consume lane (lane 0 alone with lanes = 1)",
                [*p, "lane"],
                registry=reg,
            ),
            lanes=Gauge(
                "hakafka_pipeline_lanes",
                "Consume lanes the pipeline reads with (0 while this node does not lead it)",
                p,
                registry=reg,
            ),
            buffer_bytes=Gauge(
                "hakafka_buffer_bytes", "Arrow bytes held in the memory buffer", p, registry=reg
            ),
            buffer_limit_bytes=Gauge(
                "hakafka_buffer_limit_bytes",
                "The buffer's limit_bytes (consumption pauses above it)",
                p,
                registry=reg,
            ),
            backpressure=Gauge(
                "hakafka_backpressure",
                "1 while consumption is paused at the buffer limit",
                p,
                registry=reg,
            ),
            flushes=Counter(
                "hakafka_flushes", "Block flushes by result", [*p, "result"], registry=reg
            ),
            flush_rows=Counter("hakafka_flush_rows", "Rows written to ClickHouse", p, registry=reg),
            flush_seconds=Histogram(
                "hakafka_flush_seconds",
                "Seal to checkpoint commit",
                p,
                buckets=_LATENCY_BUCKETS,
                registry=reg,
            ),
            checkpoint_lag=Gauge(
                "hakafka_checkpoint_lag",
                "Offsets consumed but not yet checkpointed, per partition",
                [*p, "partition"],
                registry=reg,
            ),
            stalled=Gauge(
                "hakafka_pipeline_stalled_seconds",
                "Seconds a leading pipeline has made no progress (a hung thread, flushes "
                "failing, or consumption paused with no flush committing); stuck at stuck_after",
                p,
                registry=reg,
            ),
            pipeline_state=Gauge(
                "hakafka_pipeline_state",
                "1 for the state a pipeline of a led shard is in (one series per pipeline): "
                "starting, recovering, consuming, draining, drained, failed, stopped, paused "
                "(by ops), or what it waits for (suspended, kafka_unreachable, "
                "waiting_for_topic, registry_unavailable, retrying_clickhouse, buffer_full, "
                "awaiting_push_retries, awaiting_previous_instance, checkpoint_overdue)",
                [*p, "state"],
                registry=reg,
            ),
            kafka_lag=Gauge(
                "hakafka_kafka_lag",
                "High watermark minus next offset to consume, per partition",
                [*p, "partition"],
                registry=reg,
            ),
            leader=Gauge(
                "hakafka_leader", "1 while this node leads the shard", ["shard"], registry=reg
            ),
            epoch=Gauge(
                "hakafka_epoch",
                "The shard's leader epoch held by this node",
                ["shard"],
                registry=reg,
            ),
            leader_changes=Counter(
                "hakafka_leader_changes",
                "Times this node began or ended leading the shard",
                ["shard"],
                registry=reg,
            ),
            leadership_corrections=Counter(
                "hakafka_leadership_corrections",
                "Times reading ZooKeeper back corrected what this node believed of its "
                "leadership (an unknown outcome, a missed watch); action says what",
                ["shard", "action"],
                registry=reg,
            ),
            balance_moves=Counter(
                "hakafka_balance_moves",
                "Shards this node handed to a co-replica because it led more than its share",
                ["shard"],
                registry=reg,
            ),
            zookeeper_connected=Gauge(
                "hakafka_zookeeper_connected",
                "1 while the ZooKeeper session is connected",
                registry=reg,
            ),
            ready=Gauge(
                "hakafka_ready",
                "1 while /ready answers 200 (ZooKeeper connected, led pipelines running)",
                registry=reg,
            ),
            flush_ready=Gauge(
                "hakafka_flush_ready",
                "1 while this node's flush path (Spark session, Python workers) is warm: "
                "elected, it flushes without waiting for Spark",
                registry=reg,
            ),
            queries=Counter(
                "hakafka_queries",
                "SQL queries answered by the query servers, by protocol and result",
                ["protocol", "result"],
                registry=reg,
            ),
            query_seconds=Histogram(
                "hakafka_query_seconds",
                "SQL query latency, from the request to the last byte of the answer",
                ["protocol"],
                buckets=_LATENCY_BUCKETS,
                registry=reg,
            ),
        )

    def observe_query(self, protocol: str, result: str, seconds: float) -> None:
        """A query server answered one query (`buffer.observe.QueryObserver`)."""
        self.queries.labels(protocol=protocol, result=result).inc()
        self.query_seconds.labels(protocol=protocol).observe(seconds)
