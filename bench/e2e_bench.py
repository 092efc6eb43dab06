"""End-to-end figures of the daemon on the local stack, each next to a baseline of the same run.

1. Ingest: after one warm-up record has gone all the way through, a sustained producer in
   this process writes 1M JSON messages on 8 partitions while one daemon leading both
   shards consumes them: rows/s and MiB/s into the buffer (Kafka -> decode -> WAL synced per
   batch -> buffer) and into ClickHouse (-> Spark -> ClickHouse, checkpointed), next to a raw
   librdkafka consume of the same messages from the same broker (and the producer's rate).
2. Catch-up: the same, but the backlog is produced before the daemon starts (its Spark
   session already up), so no producer competes with it for the cores: the daemon's own
   ingest and end-to-end rates, next to a raw consume of the same backlog, and where the CPU
   went meanwhile (read from /proc by cpu_use.py: the daemon by thread, its Spark JVM, the
   broker, ClickHouse, the rest of the machine and what the hypervisor stole).
3. Latency: single timestamped messages produced at a low rate; time until each is
   queryable in the leader's buffer (Flight) and until it is counted in ClickHouse.
4. Failover: time from an ops failover request, and from a SIGKILL of the leader, until the
   new leader consumes (its `leader` znode says so), next to the session timeout.
5. Restart: time from starting a daemon over a WAL of WAL_MIB MiB until it consumes again,
   and the rows it replayed. The fill of that WAL, with Spark started first and idle, is
   ingest with no flush running; its CPU rows are read as in the catch-up.
6. Memory: the daemon's peak RSS (VmHWM) against its configured buffer limit.
7. Sustained: a producer in its own process writes SUSTAIN_RATE rows/s for SUSTAIN_SECONDS;
   the daemon's ingest and end-to-end rates after the first minute, its RSS sampled every
   5 s (flat or not), the largest lag into ClickHouse and how long the rest took to drain.

Run: .venv/bin/python bench/e2e_bench.py [--steps ingest,sustained,...]   (about 12 minutes)
"""

from __future__ import annotations

import argparse
import functools
import json
import multiprocessing
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition
from cpu_use import CpuMeter, CpuUse, children

from buffer.client import query
from devstack.clickhouse import ClickHouseService
from devstack.cluster import LocalCluster, PipelineSpec, StackEndpoints
from devstack.kafka import KafkaBroker
from devstack.process import pid_cmdline
from devstack.records import create_topic
from devstack.zookeeper import ZooKeeperEnsemble
from hakafka.coordination import Coordinator, NodeInfo, ZkConfig
from hakafka.logs import configure as configure_logs

MIB = 1 << 20
PARTITIONS = 8
SHARDS = 2
BACKLOG = 1_000_000
CATCHUP_BACKLOG = 3_000_000  # about 12 s of catch-up: long enough to time at 0.1 s
LATENCY_SAMPLES = 100
CLICKHOUSE_SAMPLES = 10
FAILOVER_ROUNDS = 5
WAL_MIB = 1024
SESSION_TIMEOUT = 3.0
ZK_ROOT = "/hakafka/bench"
SUSTAIN_SECONDS = 300
SUSTAIN_RATE = 40_000  # rows/s: about 80% of what one daemon ingests here with a producer
SAMPLE_EVERY = 5.0
# Flush blocks of 200k-1M rows, at most 5 s old; at most 1 GiB in the buffer.
INGEST_BUFFER: dict[str, int | float] = {
    "min_rows": 200_000,
    "max_rows": 1_000_000,
    "min_bytes": 1,
    "min_age": 1,
    "max_age": 5,
    "limit_bytes": 1 << 30,
}
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
    """Seconds for librdkafka to hand over `count` messages (no per-message work), read as the
    daemon reads them: one consumer per shard, in threads, each with its shard's partitions."""
    consumers = []
    for shard in range(SHARDS):
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
        consumer.assign(
            [TopicPartition(topic, p, 0) for p in range(PARTITIONS) if p % SHARDS == shard]
        )
        consumers.append(consumer)
    got, lock, done = [0], threading.Lock(), threading.Event()

    def drain(consumer: Consumer) -> None:
        while not done.is_set():
            count_now = len(consumer.consume(10_000, 0.2))
            with lock:
                got[0] += count_now
                if got[0] >= count:
                    done.set()

    threads = [threading.Thread(target=drain, args=(c,), daemon=True) for c in consumers]
    began = time.perf_counter()
    for thread in threads:
        thread.start()
    if not done.wait(600):
        raise TimeoutError(f"raw consume got {got[0]} of {count} messages in 600 s")
    took = time.perf_counter() - began
    for thread, consumer in zip(threads, consumers, strict=True):
        thread.join(30)
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


def consumed(node: Any) -> float:
    return metric(node, "hakafka_consumed_rows_total")


def first_batch(node: Any) -> tuple[float, int]:
    """Wait for the node's first consumed batch; the time then and the rows consumed by then."""
    wait(lambda: consumed(node) > 0, 300, "the first consumed batch", 0.02)
    return time.perf_counter(), int(consumed(node))


def rate_row(
    label: str, timed: int, mib: float, seconds: float, raw_per_row: float
) -> tuple[str, ...]:
    """`timed` rows of `mib` MiB in `seconds`, with the raw consume time per row as the base."""
    return (
        label,
        f"{timed / seconds:,.0f} rows/s",
        f"{mib / seconds:.1f} MiB/s",
        f"{raw_per_row * timed / seconds:.2f}",
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


def memory_mib(pid: int, field: str = "VmHWM") -> float:
    """A memory figure of /proc/PID/status in MiB: VmHWM (peak RSS) or VmRSS (now)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


def cpu_meter(node: Any, stack_pids: dict[str, int]) -> CpuMeter:
    """A meter of the node's daemon, its Spark JVM (a child, if running) and the stack."""
    daemon = node.pid
    assert daemon is not None
    pids = {"daemon": daemon}
    for child in children(daemon):
        if "java" in " ".join(pid_cmdline(child)):
            pids["its Spark JVM"] = child
    return CpuMeter({**pids, **stack_pids})


def cpu_rows(cpu: CpuUse) -> list[tuple[str, ...]]:
    """Table rows saying where the cores went: the daemon by thread, the other processes, and
    the rest of the machine (kernel, Spark's Python workers, ZooKeeper, this bench)."""
    daemon = cpu.processes["daemon"]
    two = " + ".join(f"{c:.2f}" for c in daemon.busiest[:2])
    rows: list[tuple[str, ...]] = [
        (
            "  CPU: daemon",
            f"{daemon.cores:.2f} cores",
            f"2 busiest threads {two}",
            f"librdkafka {daemon.rdkafka:.2f}",
        )
    ]
    rows += [
        (f"  CPU: {name}", f"{use.cores:.2f} cores", "", "")
        for name, use in cpu.processes.items()
        if name != "daemon"
    ]
    rest = cpu.busy - sum(use.cores for use in cpu.processes.values())
    rows.append(
        (
            "  CPU: machine",
            f"{cpu.busy:.2f} of {cpu.cores} busy",
            f"{max(rest, 0):.2f} elsewhere",
            f"stolen {cpu.steal:.2f}",
        )
    )
    return rows


def make_cluster(
    root: Path,
    stack: StackEndpoints,
    ch: ClickHouseService,
    name: str,
    *,
    nodes: dict[str, list[int]],
    buffer: dict[str, int | float],
    spark_on_followers: bool = False,
) -> tuple[LocalCluster, str, str]:
    """Bench step `name`'s cluster (not started) under `root/name`, with a topic `e2e_<name>`
    and a ClickHouse database `name` of its own (both created here); returns it with the
    topic and the database."""
    topic, database = f"e2e_{name}", name
    create_topic(stack.kafka, topic, PARTITIONS)
    ch.client().command(f"CREATE DATABASE IF NOT EXISTS {database}")
    pipeline = PipelineSpec(
        name="events", topic=topic, table="events", columns=COLUMNS, buffer=buffer
    )
    cluster = LocalCluster(
        root / name,
        stack,
        nodes=nodes,
        shard_count=SHARDS,
        pipelines=[pipeline],
        zk_root=f"{ZK_ROOT}/{database}",
        database=database,
        session_timeout=SESSION_TIMEOUT,
        rows_per_task=500_000,
        spark_on_followers=spark_on_followers,
    )
    return cluster, topic, database


def ingest_cluster(
    root: Path, stack: StackEndpoints, ch: ClickHouseService, name: str
) -> tuple[LocalCluster, str, str]:
    """One daemon leading both shards, buffering as INGEST_BUFFER says (see make_cluster)."""
    return make_cluster(root, stack, ch, name, nodes={"n1": [0, 1]}, buffer=INGEST_BUFFER)


def ingest(
    root: Path, stack: StackEndpoints, ch: ClickHouseService, rows: list[tuple[str, ...]]
) -> None:
    limit = int(INGEST_BUFFER["limit_bytes"])
    cluster, topic, database = ingest_cluster(root, stack, ch, "ingest")
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
            lambda: consumed(node) >= BACKLOG + 1,
            600,
            "the backlog in the buffer",
            0.1,
        )
        buffered = time.perf_counter() - began
        wait(lambda: ch_count(ch, database) >= BACKLOG + 1, 900, "the backlog in ClickHouse", 0.25)
        flushed = time.perf_counter() - began
        assert node.pid is not None
        rss = memory_mib(node.pid)
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


def catchup(
    root: Path,
    stack: StackEndpoints,
    ch: ClickHouseService,
    rows: list[tuple[str, ...]],
    *,
    stack_pids: dict[str, int],
) -> None:
    """The daemon's own ingest rate: a backlog produced before it starts (no producer competes
    for the cores), Spark up before it stands for election; timed from its first consumed
    batch, next to a raw consume of the same backlog."""
    cluster, topic, database = make_cluster(
        root,
        stack,
        ch,
        "catchup",
        nodes={"n1": [0, 1]},
        buffer=INGEST_BUFFER,
        spark_on_followers=True,
    )
    size = produce_backlog(stack.kafka, topic, CATCHUP_BACKLOG)
    node = cluster.nodes["n1"]
    try:
        cluster.start()
        began, before = first_batch(node)
        meter = cpu_meter(node, stack_pids)
        meter.start()
        wait(lambda: consumed(node) >= CATCHUP_BACKLOG, 600, "the backlog in the buffer", 0.1)
        buffered = time.perf_counter() - began
        cpu = meter.stop()
        wait(
            lambda: ch_count(ch, database) >= CATCHUP_BACKLOG,
            900,
            "the backlog in ClickHouse",
            0.25,
        )
        flushed = time.perf_counter() - began
    finally:
        cluster.stop()
    raw = raw_consume(stack.kafka, topic, CATCHUP_BACKLOG)
    timed = CATCHUP_BACKLOG - before
    mib = size / MIB * timed / CATCHUP_BACKLOG
    rows.append((f"catch-up of {CATCHUP_BACKLOG:,} messages produced first:", "", "", ""))
    rows.append(
        (
            "  raw librdkafka consume (baseline)",
            f"{CATCHUP_BACKLOG / raw:,.0f} rows/s",
            f"{size / MIB / raw:.1f} MiB/s",
            "1.00",
        )
    )
    for label, seconds in (
        ("  ingest: Kafka -> WAL -> buffer", buffered),
        ("  end to end: -> Spark -> ClickHouse", flushed),
    ):
        rows.append(rate_row(label, timed, mib, seconds, raw / CATCHUP_BACKLOG))
    rows.append(
        (
            "  last row in ClickHouse after the last in the buffer",
            f"{flushed - buffered:.1f} s",
            f"max_age {INGEST_BUFFER['max_age']} s",
            "",
        )
    )
    rows += cpu_rows(cpu)


def paced_producer(bootstrap: str, topic: str, rate: int, seconds: float, sent: Any) -> None:
    """Produce `rate` messages a second for `seconds` (in 100 ms ticks, catching up when
    behind) and keep `sent` (a shared counter) at the number produced. Runs in its own process."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50, "batch.size": 1 << 20})
    began = time.monotonic()
    i = 0
    while (elapsed := time.monotonic() - began) < seconds:
        due = min(int(elapsed * rate) + rate // 10, int(seconds * rate))
        while i < due:
            try:
                producer.produce(topic, value=message(i), partition=i % PARTITIONS)
                i += 1
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
        sent.value = i
        time.sleep(max(0.0, (i / rate) - (time.monotonic() - began) - 0.1))
    if producer.flush(120) != 0:
        raise RuntimeError("sustained producer: messages undelivered after 120 s")
    sent.value = i


def sustained(
    root: Path,
    stack: StackEndpoints,
    ch: ClickHouseService,
    rows: list[tuple[str, ...]],
    *,
    rate: int = SUSTAIN_RATE,
    seconds: float = SUSTAIN_SECONDS,
) -> None:
    """A producer in another process at a fixed rate for `seconds`; the daemon's ingest and
    end-to-end rates over the run after its first minute, and its RSS sampled throughout."""
    cluster, topic, database = ingest_cluster(root, stack, ch, "sustained")
    node = cluster.nodes["n1"]
    spawn = multiprocessing.get_context("spawn")  # no librdkafka threads cross a fork
    sent = spawn.Value("q", 0)
    samples: list[tuple[float, int, float, int, float]] = []  # t, sent, consumed, in CH, RSS
    try:
        cluster.start()
        cluster.wait_leaders([0, 1])
        assert node.pid is not None
        producer = spawn.Process(
            target=paced_producer, args=(stack.kafka, topic, rate, seconds, sent), daemon=True
        )
        began = time.monotonic()
        producer.start()
        while producer.is_alive() and time.monotonic() - began < seconds + 150:
            samples.append(
                (
                    time.monotonic() - began,
                    sent.value,
                    consumed(node),
                    ch_count(ch, database),
                    memory_mib(node.pid, "VmRSS"),
                )
            )
            time.sleep(SAMPLE_EVERY)
        producer.join(5)
        if producer.exitcode != 0:
            raise SystemExit(f"sustained producer failed (exit code {producer.exitcode})")
        total = sent.value
        drain_began = time.monotonic()
        wait(lambda: ch_count(ch, database) >= total, 300, "the sustained rows in ClickHouse", 0.5)
        drained = time.monotonic() - drain_began
    finally:
        cluster.stop()
    # The window: from the end of the first minute (of the first quarter of a short run) to
    # the last sample before the producer ended.
    start = min(60.0, seconds / 4)
    window = [s for s in samples if start <= s[0] <= seconds]
    if len(window) < 2:
        raise SystemExit(f"sustained: {len(window)} samples in the window, run longer")
    first, last = window[0], window[-1]
    span = last[0] - first[0]
    mib_per_row = len(message(0)) / MIB
    lag = max(s[1] - s[3] for s in window)
    for what, index in (
        (f"sustained {seconds:.0f} s: producer (own process)", 1),
        ("  ingest: Kafka -> WAL -> buffer", 2),
        ("  end to end: -> Spark -> ClickHouse", 3),
    ):
        per_s = (last[index] - first[index]) / span
        rows.append(
            (
                what,
                f"{per_s:,.0f} rows/s",
                f"{per_s * mib_per_row:.1f} MiB/s",
                f"{per_s / ((last[1] - first[1]) / span):.2f} of produced",
            )
        )
    rss = [s[4] for s in window]
    rows.append(
        (
            f"  RSS, {start:.0f} s -> end of run",
            f"{rss[0]:,.0f} -> {rss[-1]:,.0f} MiB",
            f"min {min(rss):,.0f} max {max(rss):,.0f}",
            f"max lag {lag:,} rows, drain {drained:.1f} s",
        )
    )


def latency(
    root: Path, stack: StackEndpoints, ch: ClickHouseService, rows: list[tuple[str, ...]]
) -> None:
    cluster, topic, database = make_cluster(
        root,
        stack,
        ch,
        "latency",
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
    cluster, _, database = make_cluster(
        root,
        stack,
        ch,
        "failover",
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
    root: Path,
    stack: StackEndpoints,
    ch: ClickHouseService,
    rows: list[tuple[str, ...]],
    *,
    stack_pids: dict[str, int],
) -> None:
    count = WAL_MIB * MIB // 210  # WAL bytes per row: the Arrow IPC of a decoded ~200 B message
    cluster, topic, _ = make_cluster(
        root,
        stack,
        ch,
        "restart",
        nodes={"n1": [0, 1]},
        # No threshold is reached before the kill: a flush in flight would make the restart
        # re-flush its block first, and the step would time Spark, not the replay.
        buffer={
            "min_rows": 2 * count,
            "max_rows": 2 * count,
            "max_bytes": 3 << 30,
            "min_age": 590,
            "max_age": 600,
            "limit_bytes": 4 << 30,
        },
        # The fill times ingest alone: Spark is up before the daemon leads, not starting
        # beside the consumer (a JVM start takes most of a core for ~20 s here).
        spark_on_followers=True,
    )
    size = produce_backlog(stack.kafka, topic, count)
    node = cluster.nodes["n1"]
    try:
        cluster.start()
        began, before = first_batch(node)
        meter = cpu_meter(node, stack_pids)
        meter.start()
        wait(lambda: consumed(node) >= count, 300, "the WAL to fill", 0.1)
        filled = time.perf_counter() - began
        cpu = meter.stop()
        wal_bytes = metric(node, "hakafka_wal_bytes_total")
        if metric(node, "hakafka_flushes_total"):
            raise RuntimeError("a block was flushed before the kill: the restart would re-flush")
        node.kill(signal.SIGKILL)
        # The restart is timed as a new leader's: its Spark starts beside the replay, as it
        # does by default, instead of before it.
        config = node.config_path.read_text()
        if "on_followers = true" not in config:
            raise RuntimeError(f"{node.config_path} has no `on_followers = true` to turn off")
        node.config_path.write_text(config.replace("on_followers = true", "on_followers = false"))
        began = time.perf_counter()
        node.start()
        wait(lambda: set(node.leads()) == {0, 1}, 300, "consuming after restart", 0.05)
        took = time.perf_counter() - began
        replayed = sum(p["replayed_rows"] for p in node.pipelines())
    finally:
        cluster.stop()
    raw = raw_consume(stack.kafka, topic, count)
    timed = count - before
    rows.append(
        rate_row(
            "ingest with no flush running (the WAL fill)",
            timed,
            size / MIB * timed / count,
            filled,
            raw / count,
        )
    )
    rows += cpu_rows(cpu)
    rows.append(
        (
            f"restart over a {wal_bytes / MIB:,.0f} MiB WAL -> consuming",
            f"{took:.2f} s",
            f"{replayed:,} rows replayed",
            f"{wal_bytes / MIB / took:,.0f} MiB/s",
        )
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sustain-seconds", type=float, default=SUSTAIN_SECONDS)
    parser.add_argument("--sustain-rate", type=int, default=SUSTAIN_RATE, help="rows/s")
    parser.add_argument("--steps", default="ingest,catchup,sustained,latency,failover,restart")
    args = parser.parse_args()
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
        stack_pids = {
            name: pid for name, pid in (("broker", broker.pid), ("ClickHouse", ch.pid)) if pid
        }
        steps: dict[str, Callable[..., None]] = {
            "ingest": ingest,
            "catchup": functools.partial(catchup, stack_pids=stack_pids),
            "sustained": functools.partial(
                sustained, rate=args.sustain_rate, seconds=args.sustain_seconds
            ),
            "latency": latency,
            "failover": failover,
            "restart": functools.partial(restart, stack_pids=stack_pids),
        }
        for name in args.steps.split(","):
            print(f"... {name}", file=sys.stderr, flush=True)
            steps[name](root, stack, ch, rows)
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
