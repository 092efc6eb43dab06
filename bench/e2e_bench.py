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
import contextlib
import functools
import json
import multiprocessing
import os
import signal
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchstack import Bench, local_stack
from clickhouse_connect.driver.client import Client
from confluent_kafka import Consumer, Producer, TopicPartition
from cpu_use import CpuMeter, CpuUse, children

from buffer.client import query
from devstack.cluster import DaemonNode, LocalCluster, PipelineSpec
from devstack.process import pid_cmdline
from devstack.records import create_topic
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


Row = tuple[str, ...]
# The labels of the rows that every step timing the daemon's stages shares.
RAW = "raw librdkafka consume (baseline)"
INGEST = "ingest: Kafka -> WAL -> buffer"
END_TO_END = "end to end: -> Spark -> ClickHouse"


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


def metric(node: DaemonNode, name: str) -> float:
    code, body = node.get("/metrics")
    if code != 200:
        return 0.0
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in body.decode().splitlines()
        if line.startswith(name + "{") or line.startswith(name + " ")
    )


def consumed(node: DaemonNode) -> float:
    return metric(node, "hakafka_consumed_rows_total")


def rate_row(label: str, timed: int, mib: float, seconds: float, raw_per_row: float) -> Row:
    """`timed` rows of `mib` MiB in `seconds`, with the raw consume time per row as the base."""
    return (
        label,
        f"{timed / seconds:,.0f} rows/s",
        f"{mib / seconds:.1f} MiB/s",
        f"{raw_per_row * timed / seconds:.2f}",
    )


def scalar(client: Any, sql: str) -> int:
    return int(client.command(sql))


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


def cpu_meter(node: DaemonNode, stack_pids: dict[str, int]) -> CpuMeter:
    """A meter of the node's daemon, its Spark JVM (a child, if running) and the stack."""
    daemon = node.pid
    assert daemon is not None
    pids = {"daemon": daemon}
    for child in children(daemon):
        if "java" in " ".join(pid_cmdline(child)):
            pids["its Spark JVM"] = child
    return CpuMeter({**pids, **stack_pids})


def cpu_rows(cpu: CpuUse) -> list[Row]:
    """Table rows saying where the cores went: the daemon by thread, the other processes, and
    the rest of the machine (kernel, Spark's Python workers, ZooKeeper, this bench)."""
    daemon = cpu.processes["daemon"]
    two = " + ".join(f"{c:.2f}" for c in daemon.busiest[:2])
    rows: list[Row] = [
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


@dataclass(frozen=True)
class Step:
    """What one step's cluster differs in; `running` does the rest alike for every step."""

    name: str  # of its folder, its topic `e2e_<name>` and its ClickHouse database
    buffer: dict[str, int | float] = field(default_factory=lambda: INGEST_BUFFER)
    nodes: dict[str, list[int]] = field(default_factory=lambda: {"n1": [0, 1]})
    spark_on_followers: bool = False
    backlog: int = 0  # messages produced before the daemons start
    leaders: bool = True  # wait until both shards' leaders consume before the step's body


@dataclass(frozen=True)
class Fill:
    """The node consuming a backlog, timed from its first consumed batch (what came before it
    is startup, not ingest)."""

    began: float  # perf_counter at the first consumed batch
    rows: int  # the rows consumed after it: the ones timed
    mib: float  # their share of the backlog's MiB
    seconds: float
    cpu: CpuUse  # over those seconds


@dataclass
class StepCluster:
    """A step's cluster, its topic and ClickHouse database, and the bytes of the backlog
    produced before it started (0 if none); `running` makes one."""

    bench: Bench
    cluster: LocalCluster
    topic: str
    database: str
    backlog_bytes: int

    @property
    def node(self) -> DaemonNode:
        """The daemon of every step but the failover: the one leading both shards."""
        return self.cluster.nodes["n1"]

    @property
    def pid(self) -> int:
        pid = self.node.pid
        assert pid is not None
        return pid

    @functools.cached_property
    def client(self) -> Client:
        """A ClickHouse client of the step's database, kept for the whole step."""
        return self.bench.ch.client(database=self.database)

    def clickhouse_rows(self) -> int:
        """The rows of the step's table in ClickHouse, read with a client of its own."""
        client = self.bench.ch.client(database=self.database)
        try:
            return scalar(client, "SELECT count() FROM events")
        finally:
            client.close()

    def warm_up(self, producer: Producer) -> None:
        """Send one record (id -1) with `producer` all the way into ClickHouse: the first flush
        of a leader waits for its Spark session, which no timed figure should."""
        producer.produce(self.topic, value=message(-1), partition=0)
        producer.flush(10)
        wait(functools.partial(in_clickhouse, self.client, -1), 180, "the warm-up record", 0.1)

    def until_consumed(self, count: int, began: float, timeout: float, what: str) -> float:
        """Seconds from `began` (a perf_counter) until the node has consumed `count` rows."""
        wait(lambda: consumed(self.node) >= count, timeout, what, 0.1)
        return time.perf_counter() - began

    def until_in_clickhouse(self, count: int, began: float) -> float:
        """Seconds from `began` (a perf_counter) until ClickHouse holds `count` rows."""
        wait(lambda: self.clickhouse_rows() >= count, 900, "the backlog in ClickHouse", 0.25)
        return time.perf_counter() - began

    def fill(self, count: int, timeout: float, what: str) -> Fill:
        """The node consuming the first `count` messages of the backlog, with where the CPU
        went meanwhile."""
        wait(lambda: consumed(self.node) > 0, 300, "the first consumed batch", 0.02)
        began, before = time.perf_counter(), int(consumed(self.node))
        meter = cpu_meter(self.node, self.bench.pids)
        meter.start()
        seconds = self.until_consumed(count, began, timeout, what)
        cpu = meter.stop()
        timed = count - before
        return Fill(began, timed, self.backlog_bytes / MIB * timed / count, seconds, cpu)

    def baseline(self, count: int) -> float:
        """Seconds for raw librdkafka to read `count` messages of the step's topic; call it
        once the cluster has stopped, so that it has the cores to itself."""
        return raw_consume(self.bench.stack.kafka, self.topic, count)


@contextlib.contextmanager
def running(bench: Bench, step: Step) -> Iterator[StepCluster]:
    """The step's cluster under `root/<name>`, with a topic `e2e_<name>` and a ClickHouse
    database `<name>` of its own (both created here), its backlog produced, started, and with
    both shards' leaders consuming if `step.leaders`; stopped on leaving, however that is."""
    topic, database = f"e2e_{step.name}", step.name
    create_topic(bench.stack.kafka, topic, PARTITIONS)
    bench.ch.client().command(f"CREATE DATABASE IF NOT EXISTS {database}")
    pipeline = PipelineSpec(
        name="events", topic=topic, table="events", columns=COLUMNS, buffer=step.buffer
    )
    cluster = LocalCluster(
        bench.root / step.name,
        bench.stack,
        nodes=step.nodes,
        shard_count=SHARDS,
        pipelines=[pipeline],
        zk_root=f"{ZK_ROOT}/{database}",
        database=database,
        session_timeout=SESSION_TIMEOUT,
        rows_per_task=500_000,
        spark_on_followers=step.spark_on_followers,
    )
    size = produce_backlog(bench.stack.kafka, topic, step.backlog) if step.backlog else 0
    try:
        cluster.start()
        if step.leaders:
            cluster.wait_leaders([0, 1])
        yield StepCluster(bench, cluster, topic, database, size)
    finally:
        cluster.stop()


def ingest(bench: Bench) -> list[Row]:
    """A sustained producer in this process while the daemon consumes (its Spark session up):
    the rates into the buffer and into ClickHouse next to the producer's and a raw consume's,
    and the daemon's peak RSS against its buffer limit."""
    with running(bench, Step("ingest")) as step:
        step.warm_up(Producer({"bootstrap.servers": bench.stack.kafka}))
        # The clock starts with a sustained producer: the daemon consumes while it produces.
        began = time.perf_counter()
        size = produce_backlog(bench.stack.kafka, step.topic, BACKLOG)
        produced = time.perf_counter() - began
        buffered = step.until_consumed(BACKLOG + 1, began, 600, "the backlog in the buffer")
        flushed = step.until_in_clickhouse(BACKLOG + 1, began)
        rss = memory_mib(step.pid)
    raw = step.baseline(BACKLOG + 1)
    mib, per_row, limit = size / MIB, raw / BACKLOG, INGEST_BUFFER["limit_bytes"] / MIB
    return [
        rate_row("sustained producer (this process)", BACKLOG, mib, produced, per_row),
        rate_row(RAW, BACKLOG, mib, raw, per_row),
        rate_row(INGEST, BACKLOG, mib, buffered, per_row),
        rate_row(END_TO_END, BACKLOG, mib, flushed, per_row),
        (
            "peak RSS of the daemon (VmHWM)",
            f"{rss:,.0f} MiB",
            f"limit {limit:,.0f} MiB",
            f"{rss / limit:.2f}",
        ),
    ]


def catchup(bench: Bench) -> list[Row]:
    """The daemon's own ingest rate: a backlog produced before it starts (no producer competes
    for the cores), Spark up before it stands for election; timed from its first consumed
    batch, next to a raw consume of the same backlog."""
    spec = Step("catchup", spark_on_followers=True, backlog=CATCHUP_BACKLOG, leaders=False)
    with running(bench, spec) as step:
        fill = step.fill(CATCHUP_BACKLOG, 600, "the backlog in the buffer")
        flushed = step.until_in_clickhouse(CATCHUP_BACKLOG, fill.began)
    raw = step.baseline(CATCHUP_BACKLOG)
    per_row = raw / CATCHUP_BACKLOG
    return [
        (f"catch-up of {CATCHUP_BACKLOG:,} messages produced first:", "", "", ""),
        rate_row(f"  {RAW}", CATCHUP_BACKLOG, step.backlog_bytes / MIB, raw, per_row),
        rate_row(f"  {INGEST}", fill.rows, fill.mib, fill.seconds, per_row),
        rate_row(f"  {END_TO_END}", fill.rows, fill.mib, flushed, per_row),
        (
            "  last row in ClickHouse after the last in the buffer",
            f"{flushed - fill.seconds:.1f} s",
            f"max_age {INGEST_BUFFER['max_age']} s",
            "",
        ),
        *cpu_rows(fill.cpu),
    ]


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
    bench: Bench, *, rate: int = SUSTAIN_RATE, seconds: float = SUSTAIN_SECONDS
) -> list[Row]:
    """A producer in another process at a fixed rate for `seconds`; the daemon's ingest and
    end-to-end rates over the run after its first minute, and its RSS sampled throughout."""
    spawn = multiprocessing.get_context("spawn")  # no librdkafka threads cross a fork
    sent = spawn.Value("q", 0)
    samples: list[tuple[float, int, float, int, float]] = []  # t, sent, consumed, in CH, RSS
    with running(bench, Step("sustained")) as step:
        producer = spawn.Process(
            target=paced_producer,
            args=(bench.stack.kafka, step.topic, rate, seconds, sent),
            daemon=True,
        )
        began = time.monotonic()
        producer.start()
        while producer.is_alive() and time.monotonic() - began < seconds + 150:
            samples.append(
                (
                    time.monotonic() - began,
                    sent.value,
                    consumed(step.node),
                    step.clickhouse_rows(),
                    memory_mib(step.pid, "VmRSS"),
                )
            )
            time.sleep(SAMPLE_EVERY)
        producer.join(5)
        if producer.exitcode != 0:
            raise SystemExit(f"sustained producer failed (exit code {producer.exitcode})")
        total = sent.value
        drain_began = time.monotonic()
        wait(lambda: step.clickhouse_rows() >= total, 300, "the sustained rows in ClickHouse", 0.5)
        drained = time.monotonic() - drain_began
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
    rows: list[Row] = []
    for what, index in (
        (f"sustained {seconds:.0f} s: producer (own process)", 1),
        (f"  {INGEST}", 2),
        (f"  {END_TO_END}", 3),
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
    return rows


def latency(bench: Bench) -> list[Row]:
    """Single timestamped messages at a low rate: how long until each is queryable in the
    leader's buffer (every one) and counted in ClickHouse (every tenth)."""
    spec = Step(
        "latency",
        buffer={"min_rows": 1, "max_rows": 100_000, "min_bytes": 1, "min_age": 0.2, "max_age": 0.5},
    )
    producer = Producer({"bootstrap.servers": bench.stack.kafka, "linger.ms": 0})
    to_buffer: list[float] = []
    to_clickhouse: list[float] = []
    with running(bench, spec) as step:
        flight = f"grpc://127.0.0.1:{step.node.flight_port}"
        step.warm_up(producer)
        for i in range(LATENCY_SAMPLES):
            sent = time.perf_counter()
            # Even partitions belong to shard 0, whose buffer is the table `events`.
            partition = (2 * i) % PARTITIONS
            producer.produce(step.topic, value=message(i, time.time_ns()), partition=partition)
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
                    functools.partial(in_clickhouse, step.client, i),
                    60,
                    f"message {i} in ClickHouse",
                    0.02,
                )
                to_clickhouse.append(time.perf_counter() - sent)
        floor = min(timeit(lambda: query(flight, "SELECT 1 AS n")) for _ in range(20))
    rows: list[Row] = []
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
    return rows


def timeit(fn: Callable[[], object]) -> float:
    began = time.perf_counter()
    fn()
    return time.perf_counter() - began


def failover(bench: Bench) -> list[Row]:
    """Two daemons on one shard: time from an ops failover request, and from a SIGKILL of the
    leader, until the other one consumes, as its `leader` znode says."""
    spec = Step(
        "failover",
        nodes={"n1": [0], "n2": [0]},
        buffer={"min_rows": 1000, "min_age": 1, "max_age": 2},
        leaders=False,
    )
    ops: list[float] = []
    kills: list[float] = []
    with (
        running(bench, spec) as step,
        contextlib.closing(
            Coordinator(
                ZkConfig(hosts=bench.stack.zookeeper, root=f"{ZK_ROOT}/{step.database}"),
                "bench-ops",
                NodeInfo("", "", "", 0, "bench"),
            )
        ) as coordinator,
    ):
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
            step.cluster.nodes[victim].kill(signal.SIGKILL)
            wait(
                functools.partial(moved, consuming_leader, victim),
                60,
                "kill -9 failover",
            )
            kills.append(time.perf_counter() - began)
            step.cluster.nodes[victim].start()
            step.cluster.nodes[victim].wait_up()
    return [
        (
            what,
            f"median {statistics.median(samples) * 1000:,.0f} ms",
            f"max {max(samples) * 1000:,.0f} ms",
            f"session {SESSION_TIMEOUT * 1000:,.0f} ms",
        )
        for what, samples in (
            ("ops failover -> new leader consuming", ops),
            ("kill -9 -> new leader consuming", kills),
        )
    ]


def restart(bench: Bench) -> list[Row]:
    """The fill of a WAL of WAL_MIB MiB with no flush running (its rate and CPU rows), then
    the time from starting the daemon again over it until it consumes, and the rows replayed."""
    count = WAL_MIB * MIB // 210  # WAL bytes per row: the Arrow IPC of a decoded ~200 B message
    spec = Step(
        "restart",
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
        backlog=count,
        leaders=False,
    )
    with running(bench, spec) as step:
        node = step.node
        fill = step.fill(count, 300, "the WAL to fill")
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
    raw = step.baseline(count)
    return [
        rate_row(
            "ingest with no flush running (the WAL fill)",
            fill.rows,
            fill.mib,
            fill.seconds,
            raw / count,
        ),
        *cpu_rows(fill.cpu),
        (
            f"restart over a {wal_bytes / MIB:,.0f} MiB WAL -> consuming",
            f"{took:.2f} s",
            f"{replayed:,} rows replayed",
            f"{wal_bytes / MIB / took:,.0f} MiB/s",
        ),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sustain-seconds", type=float, default=SUSTAIN_SECONDS)
    parser.add_argument("--sustain-rate", type=int, default=SUSTAIN_RATE, help="rows/s")
    parser.add_argument("--steps", default="ingest,catchup,sustained,latency,failover,restart")
    args = parser.parse_args()
    configure_logs("console", "warning")  # the table, not the ops client's connection events
    steps: dict[str, Callable[[Bench], list[Row]]] = {
        "ingest": ingest,
        "catchup": catchup,
        "sustained": functools.partial(
            sustained, rate=args.sustain_rate, seconds=args.sustain_seconds
        ),
        "latency": latency,
        "failover": failover,
        "restart": restart,
    }
    rows: list[Row] = []
    try:
        with local_stack("hakafka-e2e-bench-") as bench:
            for name in args.steps.split(","):
                print(f"... {name}", file=sys.stderr, flush=True)
                rows += steps[name](bench)
    finally:
        report(rows)
    return 0


def report(rows: list[Row]) -> None:
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
