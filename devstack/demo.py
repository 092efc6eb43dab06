"""`make demo`: the whole thing on this machine, start to finish, in about two minutes.

Starts the local stack with two ClickHouse servers (one per shard), three daemons (two
shards, two replicas each: n1 serves both, n2 shard 0, n3 shard 1), produces sample events (a
few malformed), shows rows arriving in ClickHouse, queries a leader's memory buffer, moves a
shard's leadership with an ops failover, produces more, checks the exactly-once count, and
ends with a Spark job reading both shards, live buffer included, while more events arrive.
Everything it started is stopped by PID, also when it fails.

The terminal shows the demo's story only. Every service and daemon logs to its own file
under the demo's directory; this process's own log lines (its ZooKeeper clients, kazoo, the
Spark reader's JVM output as `spark.output` events) go to `demo.log` there.
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from buffer.client import query
from devstack.clickhouse import ClickHouseService
from devstack.cluster import LocalCluster, PipelineSpec, StackEndpoints
from devstack.kafka import KafkaBroker
from devstack.records import EVENT_COLUMNS, Produced, create_topic, produce, tally
from devstack.zookeeper import ZooKeeperEnsemble
from hakafka import logs
from hakafka.config import load_config
from hakafka.coordination import Coordinator, NodeInfo, ZkConfig
from hakafka.ops.cluster_view import cluster_view
from hakafka.settings import connection_of

TOPIC = "demo_events"
PARTITIONS = 8
BATCHES = 4
PER_BATCH = 50_000
ZK_ROOT = "/hakafka/demo"


def say(text: str) -> None:
    print(f"[demo] {text}", flush=True)


def wait(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.5)


def run(root: Path) -> bool:
    began = time.monotonic()
    # Debug: Spark's WARN lines are debug `spark.output` events, and they belong in the file.
    logs.configure("console", "debug", logs.LogSink(root / "demo.log"))
    zk = ZooKeeperEnsemble(root / "zookeeper", members=1)
    broker = KafkaBroker(root / "kafka")
    ch = ClickHouseService(root / "clickhouse")
    ch2 = ClickHouseService(root / "clickhouse2")
    cluster: LocalCluster | None = None
    try:
        for name, service in (
            ("ZooKeeper", zk),
            ("Kafka (tansu)", broker),
            ("ClickHouse of shard 0 (chdb front)", ch),
            ("ClickHouse of shard 1 (chdb front)", ch2),
        ):
            service.start()
            say(f"{name} is up")
        servers = (f"127.0.0.1:{ch.port}", f"127.0.0.1:{ch2.port}")
        stack = StackEndpoints(zk.hosts, broker.bootstrap, servers[0], servers)
        create_topic(broker.bootstrap, TOPIC, PARTITIONS)
        pipeline = PipelineSpec(
            name="events",
            topic=TOPIC,
            table="events",
            columns=EVENT_COLUMNS,
            buffer={
                "min_rows": 20_000,
                "max_rows": 200_000,
                "min_bytes": 1,
                "min_age": 1,
                "max_age": 3,
            },
        )
        cluster = LocalCluster(
            root / "cluster",
            stack,
            nodes={"n1": [0, 1], "n2": [0], "n3": [1]},
            shard_count=2,
            pipelines=[pipeline],
            zk_root=ZK_ROOT,
        )
        cluster.start()
        leaders = cluster.wait_leaders([0, 1])
        say(f"3 daemons running; leaders: shard 0 -> {leaders[0]}, shard 1 -> {leaders[1]}")
        client = BothShards((ch.client(), ch2.client()))
        produced = Produced()
        for i in range(BATCHES):
            produced |= produce(
                broker.bootstrap,
                TOPIC,
                PER_BATCH,
                partitions=PARTITIONS,
                start=i * PER_BATCH,
                bad_every=1000,
            )
            say(f"produced {(i + 1) * PER_BATCH:,} events ({len(produced.bad)} malformed)")
            if i == 0:
                show_buffer_query(cluster, leaders[0])
                show_progress(client, len(produced.good))
            if i == 1:
                leaders = fail_over(cluster, zk.hosts, shard=0)
        wait(
            lambda: count(client, "events") >= len(produced.good), 180, "every event in ClickHouse"
        )
        wait(
            lambda: count(client, "events_dead_letter") >= len(produced.bad),
            60,
            "every dead letter",
        )
        time.sleep(4)  # one more flush cycle: a duplicate would show up now
        rows = tally(client, "events", produced.good)
        dead = tally(client, "events_dead_letter", produced.bad)
        say(
            f"ClickHouse events: {rows.rows:,} rows for {len(produced.good):,} good records; "
            f"duplicates {rows.duplicates}, missing {rows.missing}"
        )
        say(
            f"ClickHouse events_dead_letter: {dead.rows} rows for {len(produced.bad)} malformed "
            f"records; duplicates {dead.duplicates}, missing {dead.missing}"
        )
        sample = client.query(
            "SELECT _partition, _offset, left(_error, 60) FROM events_dead_letter"
            " ORDER BY _partition, _offset LIMIT 2"
        ).result_rows
        for partition, offset, error in sample:
            say(f"  dead letter partition {partition} offset {offset}: {error}")
        ok = rows.exactly_once and dead.exactly_once
        say(f"exactly once: {'YES' if ok else 'NO'}")
        ok = spark_reads_both_shards(cluster, broker.bootstrap, start=BATCHES * PER_BATCH) and ok
        say(f"demo took {time.monotonic() - began:.0f} s")
        return ok
    finally:
        if cluster is not None:
            cluster.stop()
        for service in (ch2, ch, broker, zk):
            service.stop()
        say(f"stopped every process it started; logs and data under {root}")


@dataclass(frozen=True)
class Rows:
    result_rows: list[Any]


@dataclass(frozen=True)
class BothShards:
    """The clients of both shards' ClickHouse servers, queried as one: the rows of each."""

    clients: Sequence[Any]

    def query(self, sql: str) -> Rows:
        return Rows([row for c in self.clients for row in c.query(sql).result_rows])

    def command(self, sql: str) -> int:
        return sum(int(c.command(sql)) for c in self.clients)


def count(client: object, table: str) -> int:
    return int(client.command(f"SELECT count() FROM {table}"))  # type: ignore[attr-defined]


def spark_reads_both_shards(cluster: LocalCluster, bootstrap: str, start: int) -> bool:
    """A Spark job reading `events` from both shards plus the leaders' buffers while more
    events arrive: every (partition, offset) once."""
    from pyspark.sql import functions as sf

    from spark_bridge.jvm_output import log_line
    from spark_bridge.reader import read_table
    from spark_bridge.runtime import SparkRuntime, SparkSettings

    config = load_config(cluster.nodes["n1"].config_path)
    database, connection = config.clickhouse.database, connection_of(config)
    with SparkRuntime(SparkSettings(app_name="hakafka-demo-reader"), output=log_line) as spark:
        # Spark is up first: the new events are read while still in the leaders' buffers.
        produce(bootstrap, TOPIC, PER_BATCH // 5, partitions=PARTITIONS, start=start)
        df = read_table(
            spark,
            "events",
            cluster=cluster_view(config, "events", include_buffer=True),
            include_buffer=True,
            database=database,
            connection=connection,
        )
        per = df.groupBy("_partition").agg(
            sf.count("*").alias("rows"), sf.countDistinct("_offset").alias("offsets")
        )
        found = per.collect()
        flushed = read_table(
            spark,
            "events",
            cluster=cluster_view(config, "events"),
            database=database,
            connection=connection,
        )
        in_clickhouse = flushed.count()
    total = sum(r.rows for r in found)
    ok = all(r.rows == r.offsets for r in found)
    say(
        f"Spark read_table over both shards with the live buffer: {total:,} rows, each "
        f"(partition, offset) once: {'YES' if ok else 'NO'} (ClickHouse alone, read just "
        f"after: {in_clickhouse:,})"
    )
    return ok


def show_progress(client: object, good: int) -> None:
    wait(lambda: count(client, "events") > 0, 120, "the first flush")
    per_partition = client.query(  # type: ignore[attr-defined]
        "SELECT _partition, count() FROM events GROUP BY _partition ORDER BY _partition"
    ).result_rows
    say(
        f"in ClickHouse so far: {count(client, 'events'):,} of {good:,} good rows; per partition: "
        + ", ".join(f"{p}:{n:,}" for p, n in per_partition)
    )


def show_buffer_query(cluster: LocalCluster, leader: str) -> None:
    node = cluster.nodes[leader]
    # Rows stay queryable in the leader's memory until their block's checkpoint commits.
    wait(lambda: node.status()["shards"][0]["pipelines"][0]["buffer_rows"] > 0, 30, "buffered rows")
    table = query(
        f"grpc://127.0.0.1:{node.flight_port}",
        "SELECT kind, count(*) AS n FROM events GROUP BY kind ORDER BY kind",
    )
    rows = ", ".join(
        f"{k}={n}"
        for k, n in zip(
            table.column("kind").to_pylist(), table.column("n").to_pylist(), strict=True
        )
    )
    say(f"buffer query on {leader} (rows held in memory, not yet checkpointed), by kind: {rows}")


def fail_over(cluster: LocalCluster, hosts: str, shard: int) -> dict[int, str]:
    before = cluster.leaders()[shard]
    coordinator = Coordinator(
        ZkConfig(hosts=hosts, root=ZK_ROOT), "demo-ops", NodeInfo("", "", "", 0, "demo")
    )
    coordinator.start()
    try:
        began = time.monotonic()
        coordinator.request_failover(shard, by="demo")
        wait(
            lambda: cluster.leaders().get(shard) not in (None, before),
            60,
            "the new leader to consume",
        )
        leaders = cluster.leaders()
        say(
            f"ops failover of shard {shard}: {before} -> {leaders[shard]}, consuming again after "
            f"{time.monotonic() - began:.2f} s"
        )
        return leaders
    finally:
        coordinator.close()


def main() -> int:
    root = Path(tempfile.mkdtemp(prefix="hakafka-demo-"))
    try:
        return 0 if run(root) else 1
    except Exception as exc:
        say(f"FAILED: {type(exc).__name__}: {exc}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
