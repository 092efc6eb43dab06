"""`make demo`: the whole thing on this machine, start to finish, in about two minutes.

Starts the local stack, three daemons (two shards, two replicas each: n1 serves both,
n2 shard 0, n3 shard 1), produces sample events (a few malformed), shows rows arriving in
ClickHouse, queries a leader's memory buffer, moves a shard's leadership with an ops
failover, produces more, and ends with the exactly-once count. Everything it started is
stopped by PID, also when it fails.
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from buffer.client import query
from devstack.clickhouse import ClickHouseService
from devstack.cluster import LocalCluster, PipelineSpec, StackEndpoints
from devstack.kafka import KafkaBroker
from devstack.records import EVENT_COLUMNS, Produced, create_topic, produce, tally
from devstack.zookeeper import ZooKeeperEnsemble
from hakafka.coordination import Coordinator, NodeInfo, ZkConfig

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
    zk = ZooKeeperEnsemble(root / "zookeeper", members=1)
    broker = KafkaBroker(root / "kafka")
    ch = ClickHouseService(root / "clickhouse")
    cluster: LocalCluster | None = None
    try:
        for name, service in (
            ("ZooKeeper", zk),
            ("Kafka (tansu)", broker),
            ("ClickHouse (chdb front)", ch),
        ):
            service.start()
            say(f"{name} is up")
        stack = StackEndpoints(zk.hosts, broker.bootstrap, f"127.0.0.1:{ch.port}")
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
        client = ch.client()
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
        say(f"exactly once: {'YES' if ok else 'NO'} — demo took {time.monotonic() - began:.0f} s")
        return ok
    finally:
        if cluster is not None:
            cluster.stop()
        for service in (ch, broker, zk):
            service.stop()
        say(f"stopped every process it started; logs and data under {root}")


def count(client: object, table: str) -> int:
    return int(client.command(f"SELECT count() FROM {table}"))  # type: ignore[attr-defined]


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
