"""End-to-end figures of the daemon on the local stack, each next to a baseline of the same run.

1. Ingest: after one warm-up record has gone all the way through, a sustained producer in
   this process writes 1M JSON messages on 8 partitions while one daemon leading both
   shards consumes them: rows/s and MiB/s into the buffer (Kafka -> decode -> WAL synced per
   batch -> buffer) and into ClickHouse (-> Spark -> ClickHouse, checkpointed), next to a raw
   librdkafka consume of the same messages from the same broker (and the producer's rate).
2. Latency: single timestamped messages produced at a low rate; time until each is
   queryable in the leader's buffer (Flight) and until it is counted in ClickHouse.
3. Failover: time from an ops failover request, and from a SIGKILL of the leader, until the
   new leader consumes (its `leader` znode says so), next to the session timeout.
4. Restart: time from starting a daemon over a WAL of WAL_MIB MiB until it consumes again,
   and the rows it replayed.
5. Memory: the daemon's peak RSS (VmHWM) against its configured buffer limit.

Run: .venv/bin/python bench/e2e_bench.py    (about 4-6 minutes)
"""

from __future__ import annotations

import functools
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition

from buffer.client import query
from hakafka.coordination import Coordinator, NodeInfo, ZkConfig
from hakafka.devstack.clickhouse import ClickHouseService
from hakafka.devstack.cluster import LocalCluster, PipelineSpec, StackEndpoints
from hakafka.devstack.kafka import KafkaBroker
from hakafka.devstack.records import create_topic
from hakafka.devstack.zookeeper import ZooKeeperEnsemble
from hakafka.logs import configure as configure_logs

MIB = 1 << 20
PARTITIONS = 8
BACKLOG = 1_000_000
LATENCY_SAMPLES = 100
CLICKHOUSE_SAMPLES = 10
FAILOVER_ROUNDS = 5
WAL_MIB = 1024
SESSION_TIMEOUT = 3.0
ZK_ROOT = "/hakafka/bench"
COLUMNS = {
    "id": "Int64",
    "user": "String",
    "kind": "LowCardinality(String)",
    "amount": "Float64",
    "country": "LowCardinality(String)",
    "note": "String",
    "sent_ns": "Int64",
}


def message(i: int, sent_ns: int = 0) -> bytes:
    body = {
        "id": i,
        "user": f"user-{i % 50_000:06d}",
        "kind": ("click", "view", "buy", "share")[i % 4],
        "amount": round(i % 10_000 / 7, 2),
        "country": ("de", "fr", "us", "cn", "br")[i % 5],
        "note": "x" * 106,
        "sent_ns": sent_ns,
    }
    return json.dumps(body, separators=(",", ":")).encode()


def wait(check: Callable[[], bool], timeout: float, what: str, interval: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def produce_backlog(bootstrap: str, topic: str, count: int) -> int:
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 50,
            "batch.size": 1 << 20,
            "compression.type": "none",
        }
    )
    size = 0
    for i in range(count):
        value = message(i)
        size += len(value)
        while True:
            try:
                producer.produce(topic, value=value, partition=i % PARTITIONS)
                break
            except BufferError:
                producer.poll(0.05)
    producer.flush(120)
    return size


def raw_consume(bootstrap: str, topic: str, count: int) -> float:
    """Seconds for librdkafka to hand over `count` messages (no per-message work)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "bench-raw",
            "enable.auto.commit": False,
            "fetch.max.bytes": 64 * MIB,
            "max.partition.fetch.bytes": 16 * MIB,
            "queued.max.messages.kbytes": 262144,
            "fetch.wait.max.ms": 10,
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    got = 0
    began = time.perf_counter()
    while got < count:
        got += len(consumer.consume(10_000, 1.0))
    took = time.perf_counter() - began
    consumer.close()
    return took


def metric(node: Any, name: str) -> float:
    code, body = node.get("/metrics")
    if code != 200:
        return 0.0
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in body.decode().splitlines()
        if line.startswith(name + "{") or line.startswith(name + " ")
    )


def scalar(client: Any, sql: str) -> int:
    return int(client.command(sql))


def ch_count(ch: ClickHouseService, database: str) -> int:
    client = ch.client(database=database)
    try:
        return scalar(client, "SELECT count() FROM events")
    finally:
        client.close()


def in_buffer(flight: str, sql: str) -> bool:
    return bool(query(flight, sql).column("n")[0].as_py() > 0)


def in_clickhouse(client: Any, i: int) -> bool:
    return scalar(client, f"SELECT count() FROM events WHERE id = {i}") > 0


def moved(leader: Callable[[], str | None], before: str | None) -> bool:
    return leader() not in (None, before)


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def make_cluster(
    root: Path,
    stack: StackEndpoints,
    *,
    database: str,
    topic: str,
    nodes: dict[str, list[int]],
    buffer: dict[str, int | float],
) -> LocalCluster:
    pipeline = PipelineSpec(
        name="events", topic=topic, table="events", columns=COLUMNS, buffer=buffer
    )
    return LocalCluster(
        root,
        stack,
        nodes=nodes,
        shard_count=2,
        pipelines=[pipeline],
        zk_root=f"{ZK_ROOT}/{database}",
        database=database,
        session_timeout=SESSION_TIMEOUT,
        rows_per_task=500_000,
    )


def ingest(
    root: Path, stack: StackEndpoints, ch: ClickHouseService, rows: list[tuple[str, ...]]
) -> None:
    topic, database = "e2e_ingest", "ingest"
    create_topic(stack.kafka, topic, PARTITIONS)
    ch.client().command(f"CREATE DATABASE IF NOT EXISTS {database}")
    limit = 1 << 30
    cluster = make_cluster(
        root / "ingest",
        stack,
        database=database,
        topic=topic,
        nodes={"n1": [0, 1]},
        buffer={
            "min_rows": 200_000,
            "max_rows": 1_000_000,
            "min_bytes": 1,
            "min_age": 1,
            "max_age": 5,
            "limit_bytes": limit,
        },
    )
    node = cluster.nodes["n1"]
    try:
        cluster.start()
        cluster.wait_leaders([0, 1])
        # Warm up: one record all the way to ClickHouse (the leader's Spark session is up).
        warm = Producer({"bootstrap.servers": stack.kafka})
        warm.produce(topic, value=message(-1), partition=0)
        warm.flush(10)
        client = ch.client(database=database)
        wait(functools.partial(in_clickhouse, client, -1), 180, "the warm-up record", 0.1)
        # The clock starts with a sustained producer: the daemon consumes while it produces.
        began = time.perf_counter()
        size = produce_backlog(stack.kafka, topic, BACKLOG)
        produced = time.perf_counter() - began
        wait(
            lambda: metric(node, "hakafka_consumed_rows_total") >= BACKLOG + 1,
            600,
            "the backlog in the buffer",
            0.1,
        )
        buffered = time.perf_counter() - began
        wait(lambda: ch_count(ch, database) >= BACKLOG + 1, 900, "the backlog in ClickHouse", 0.25)
        flushed = time.perf_counter() - began
        assert node.pid is not None
        rss = peak_rss_mib(node.pid)
    finally:
        cluster.stop()
    raw = raw_consume(stack.kafka, topic, BACKLOG + 1)
    mib = size / MIB
    rows.append(
        (
            "sustained producer (this process)",
            f"{BACKLOG / produced:,.0f} rows/s",
            f"{mib / produced:.1f} MiB/s",
            f"{raw / produced:.2f}",
        )
    )
    rows.append(
        (
            "raw librdkafka consume (baseline)",
            f"{BACKLOG / raw:,.0f} rows/s",
            f"{mib / raw:.1f} MiB/s",
            "1.00",
        )
    )
    rows.append(
        (
            "ingest: Kafka -> WAL -> buffer",
            f"{BACKLOG / buffered:,.0f} rows/s",
            f"{mib / buffered:.1f} MiB/s",
            f"{raw / buffered:.2f}",
        )
    )
    rows.append(
        (
            "end to end: -> Spark -> ClickHouse",
            f"{BACKLOG / flushed:,.0f} rows/s",
            f"{mib / flushed:.1f} MiB/s",
            f"{raw / flushed:.2f}",
        )
    )
    rows.append(
        (
            "peak RSS of the daemon (VmHWM)",
            f"{rss:,.0f} MiB",
            f"limit {limit / MIB:,.0f} MiB",
            f"{rss / (limit / MIB):.2f}",
        )
    )


def latency(
    root: Path, stack: StackEndpoints, ch: ClickHouseService, rows: list[tuple[str, ...]]
) -> None:
    topic, database = "e2e_latency", "latency"
    create_topic(stack.kafka, topic, PARTITIONS)
    ch.client().command(f"CREATE DATABASE IF NOT EXISTS {database}")
    cluster = make_cluster(
        root / "latency",
        stack,
        database=database,
        topic=topic,
        nodes={"n1": [0, 1]},
        buffer={"min_rows": 1, "max_rows": 100_000, "min_bytes": 1, "min_age": 0.2, "max_age": 0.5},
    )
    node = cluster.nodes["n1"]
    producer = Producer({"bootstrap.servers": stack.kafka, "linger.ms": 0})
    to_buffer: list[float] = []
    to_clickhouse: list[float] = []
    try:
        cluster.start()
        cluster.wait_leaders([0, 1])
        flight = f"grpc://127.0.0.1:{node.flight_port}"
        client = ch.client(database=database)
        # Warm up: the first flush of a leader waits for its Spark session.
        producer.produce(topic, value=message(-1), partition=0)
        producer.flush(5)
        wait(
            functools.partial(in_clickhouse, client, -1),
            120,
            "the warm-up message in ClickHouse",
            0.1,
        )
        for i in range(LATENCY_SAMPLES):
            sent = time.perf_counter()
            # Even partitions belong to shard 0, whose buffer is the table `events`.
            partition = (2 * i) % PARTITIONS
            producer.produce(topic, value=message(i, time.time_ns()), partition=partition)
            producer.flush(5)
            sql = f"SELECT count(*) AS n FROM events WHERE id = {i}"
            wait(
                functools.partial(in_buffer, flight, sql),
                30,
                f"message {i} in the buffer",
                0.002,
            )
            to_buffer.append(time.perf_counter() - sent)
            if i % (LATENCY_SAMPLES // CLICKHOUSE_SAMPLES) == 0:
                wait(
                    functools.partial(in_clickhouse, client, i),
                    60,
                    f"message {i} in ClickHouse",
                    0.02,
                )
                to_clickhouse.append(time.perf_counter() - sent)
        floor = min(timeit(lambda: query(flight, "SELECT 1 AS n")) for _ in range(20))
    finally:
        cluster.stop()
    for what, samples in (
        ("produce -> queryable in buffer", to_buffer),
        ("produce -> visible in ClickHouse", to_clickhouse),
    ):
        q = statistics.quantiles(samples, n=100, method="inclusive")
        rows.append(
            (
                f"{what} ({len(samples)} msgs)",
                f"p50 {q[49] * 1000:,.0f} ms",
                f"p99 {q[98] * 1000:,.0f} ms",
                f"query floor {floor * 1000:.1f} ms",
            )
        )


def timeit(fn: Callable[[], object]) -> float:
    began = time.perf_counter()
    fn()
    return time.perf_counter() - began


def failover(
    root: Path, stack: StackEndpoints, ch: ClickHouseService, rows: list[tuple[str, ...]]
) -> None:
    topic, database = "e2e_failover", "failover"
    create_topic(stack.kafka, topic, PARTITIONS)
    ch.client().command(f"CREATE DATABASE IF NOT EXISTS {database}")
    cluster = make_cluster(
        root / "failover",
        stack,
        database=database,
        topic=topic,
        nodes={"n1": [0], "n2": [0]},
        buffer={"min_rows": 1000, "min_age": 1, "max_age": 2},
    )
    coordinator = Coordinator(
        ZkConfig(hosts=stack.zookeeper, root=f"{ZK_ROOT}/{database}"),
        "bench-ops",
        NodeInfo("", "", "", 0, "bench"),
    )
    ops: list[float] = []
    kills: list[float] = []
    try:
        cluster.start()
        coordinator.start()

        def consuming_leader() -> str | None:
            info = coordinator.leader_of(0)
            return info.node if info is not None and info.status == "consuming" else None

        wait(lambda: consuming_leader() is not None, 120, "a consuming leader")
        for _ in range(FAILOVER_ROUNDS):
            before = consuming_leader()
            began = time.perf_counter()
            coordinator.request_failover(0, by="bench")
            wait(functools.partial(moved, consuming_leader, before), 60, "ops failover")
            ops.append(time.perf_counter() - began)
        for _ in range(FAILOVER_ROUNDS):
            victim = consuming_leader()
            assert victim is not None
            began = time.perf_counter()
            cluster.nodes[victim].kill(signal.SIGKILL)
            wait(
                functools.partial(moved, consuming_leader, victim),
                60,
                "kill -9 failover",
            )
            kills.append(time.perf_counter() - began)
            cluster.nodes[victim].start()
            cluster.nodes[victim].wait_up()
    finally:
        coordinator.close()
        cluster.stop()
    for what, samples in (
        ("ops failover -> new leader consuming", ops),
        ("kill -9 -> new leader consuming", kills),
    ):
        rows.append(
            (
                what,
                f"median {statistics.median(samples) * 1000:,.0f} ms",
                f"max {max(samples) * 1000:,.0f} ms",
                f"session {SESSION_TIMEOUT * 1000:,.0f} ms",
            )
        )


def restart(
    root: Path, stack: StackEndpoints, ch: ClickHouseService, rows: list[tuple[str, ...]]
) -> None:
    topic, database = "e2e_restart", "restart"
    create_topic(stack.kafka, topic, PARTITIONS)
    ch.client().command(f"CREATE DATABASE IF NOT EXISTS {database}")
    count = WAL_MIB * MIB // 210  # WAL bytes per row: the Arrow IPC of a decoded ~200 B message
    produce_backlog(stack.kafka, topic, count)
    cluster = make_cluster(
        root / "restart",
        stack,
        database=database,
        topic=topic,
        nodes={"n1": [0, 1]},
        buffer={
            "min_rows": 1_900_000,
            "max_rows": 2_000_000,
            "min_age": 590,
            "max_age": 600,
            "limit_bytes": 4 << 30,
        },
    )
    node = cluster.nodes["n1"]
    try:
        cluster.start()
        cluster.wait_leaders([0, 1])
        wait(
            lambda: metric(node, "hakafka_consumed_rows_total") >= count,
            300,
            "the WAL to fill",
            0.2,
        )
        wal_bytes = metric(node, "hakafka_wal_bytes_total")
        node.kill(signal.SIGKILL)
        began = time.perf_counter()
        node.start()
        wait(lambda: set(node.leads()) == {0, 1}, 300, "consuming after restart", 0.05)
        took = time.perf_counter() - began
        replayed = sum(p["replayed_rows"] for p in node.pipelines())
    finally:
        cluster.stop()
    rows.append(
        (
            f"restart over a {wal_bytes / MIB:,.0f} MiB WAL -> consuming",
            f"{took:.2f} s",
            f"{replayed:,} rows replayed",
            f"{wal_bytes / MIB / took:,.0f} MiB/s",
        )
    )


def main() -> int:
    configure_logs("console", "warning")  # the table, not the ops client's connection events
    root = Path(tempfile.mkdtemp(prefix="hakafka-e2e-bench-"))
    zk, broker, ch = (
        ZooKeeperEnsemble(root / "zk"),
        KafkaBroker(root / "kafka"),
        ClickHouseService(root / "ch"),
    )
    rows: list[tuple[str, ...]] = []
    try:
        for service in (zk, broker, ch):
            service.start()
        stack = StackEndpoints(zk.hosts, broker.bootstrap, f"127.0.0.1:{ch.port}")
        for step in (ingest, latency, failover, restart):
            print(f"... {step.__name__}", file=sys.stderr, flush=True)
            step(root, stack, ch, rows)
    finally:
        for service in (ch, broker, zk):
            service.stop()
        report(rows)
    return 0


def report(rows: list[tuple[str, ...]]) -> None:
    print(
        f"e2e bench: {BACKLOG:,} JSON messages of ~{len(message(0))} B, {PARTITIONS} partitions, "
        f"one daemon leading 2 shards, {os.cpu_count()} cores shared by broker, ClickHouse, "
        "Spark and the daemon"
    )
    if not rows:
        return
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        print("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(r)))
    print("ratio column: raw consume time / stage time (ingest), or the baseline named")


if __name__ == "__main__":
    sys.exit(main())
