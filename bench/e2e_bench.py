"""End-to-end figures of the daemon on the local stack, each next to a baseline of the same run.

Every load is written by PRODUCERS spawned processes (`Producers`): messages of the shape of
`message` encoded without json.dumps, handed to librdkafka a claim at a time (`produce_batch`)
and sent in batches (lz4 for the sustained load, uncompressed otherwise), either as fast as
they can or paced in TICK ticks to a rate shared through one counter of claimed ids.

1. Ingest: after one warm-up record has gone all the way through, the producers write 1M JSON
   messages on 8 partitions while one daemon leading both shards consumes them: rows/s and
   MiB/s into the buffer (Kafka -> decode -> WAL synced per batch -> buffer) and into
   ClickHouse (-> Spark -> ClickHouse, checkpointed), next to a raw librdkafka consume of the
   same messages from the same broker (and the producers' rate); the daemon's peak RSS
   (VmHWM) against its configured buffer limit.
2. Catch-up: the same, but the backlog is produced before the daemon starts (its Spark
   session already up), so no producer competes with it for the cores: the daemon's own
   ingest and end-to-end rates (blocks at most 1 s old, so that the last blocks' wait is a
   small part of it), next to a raw consume of the same backlog; where the CPU went from the
   first consumed batch to the last row in ClickHouse (read from /proc by cpu_use.py: the
   daemon by thread, its Spark JVM and Python workers, the broker, ClickHouse, the rest of the
   machine and what the hypervisor stole), and the rows and MiB per core used by the daemon
   and its Spark next to clickhouse_sinker's published figure.
   With `--lanes 1,2` it runs once per lanes value, each with its own backlog and baseline
   (the sustained rate is then taken from the last).
3. Sustained: the producers alone for PROBE_SECONDS as fast as they can (their rate must pass
   the target, or the figure is theirs), then SUSTAIN_SHARE of the catch-up's end-to-end rate
   (or --sustain-rate) for SUSTAIN_SECONDS: the produced, ingest and end-to-end rates after
   the first minute against the catch-up's, the daemon's RSS at the minute and at the end,
   the lag into ClickHouse at both and its largest, and how long the rest took to drain.
4. Latency: single timestamped messages produced at a low rate; time until each is
   queryable in the leader's buffer (Flight) and until it is counted in ClickHouse. Then,
   with the producers writing half the sustained rate, LOADED_PROBES timestamped messages
   until each is counted in ClickHouse.
5. Failover: time from an ops failover request, and from a SIGKILL of the leader, until the
   new leader consumes (its `leader` znode says so), next to the session timeout.
6. Restart: time from starting a daemon over a WAL of WAL_MIB MiB until it consumes again,
   and the rows it replayed. The fill of that WAL, with Spark started first and idle, is
   ingest with no flush running; its CPU rows are read as in the catch-up.

Run: PYTHONPATH=. .venv/bin/python bench/e2e_bench.py   (about 12 minutes; --help for a part)
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import math
import multiprocessing
import os
import signal
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Event, Semaphore
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
CATCHUP_BACKLOG = 3_000_000  # about 15 s of catch-up: long enough to time at 0.1 s
LATENCY_SAMPLES = 100
CLICKHOUSE_SAMPLES = 10
LOADED_PROBES = 120
PROBE_EVERY = 0.1  # s between two probes under load
PROBE_POLL = 0.02  # s between two ClickHouse queries for the probes
LOAD_SETTLE = 3.0  # s of load before the first probe: blocks reach their steady size
FAILOVER_ROUNDS = 5
WAL_MIB = 1024
SESSION_TIMEOUT = 3.0
ZK_ROOT = "/hakafka/bench"
SUSTAIN_SECONDS = 300
SUSTAIN_SHARE = 0.8  # of the catch-up's end-to-end rate: the sustained target (#23's bar)
SAMPLE_EVERY = 2.0
PRODUCERS = 1  # processes: one, batched (`produce_batch`), outruns the daemon 3x here
PRODUCER_PROCESSES = f"{PRODUCERS} producer process{'es' if PRODUCERS > 1 else ''}"
PRODUCE_CHUNK = 5_000  # ids a producer process claims at a time
# ...and at least, unless the load is at its end: claiming whatever was due since the last
# claim, a paced producer spun on claims of a few dozen (1.07 cores alone for 160k/s).
MIN_CLAIM = 1_000
TICK = 0.1  # s: paced producers stay at most this far ahead of their rate
PROBE_SECONDS = 5.0  # of the producers alone, before the sustained run
PRODUCER_CONFIG: dict[str, int | str] = {
    "linger.ms": 50,
    "batch.size": 1 << 20,
    "batch.num.messages": 100_000,
    "queue.buffering.max.messages": 2_000_000,
    "queue.buffering.max.kbytes": 1 << 20,
}
# The sustained load is written as lz4 batches, as most deployments write them: tansu keeps
# batches as they come and works per byte, 0.65 -> 0.15 us of its CPU per produced message.
# Uncompressed, the broker took 0.35 of the 2 cores from the daemon it measures.
SUSTAIN_COMPRESSION = "lz4"
QUEUE_HIGH = 1_000_000  # messages in librdkafka's queue before a producer waits for it
# clickhouse_sinker's published figure (../shared/reference/peers.md, its
# docs/dev/introduction.md): 754-byte JSON messages, 142k rows/s on 11 CPUs.
SINKER_ROWS, SINKER_CPUS, SINKER_BYTES = 142_000, 11, 754
# Flush blocks of 200k-1M rows, at most 1 s old; at most 1 GiB in the buffer.
INGEST_BUFFER: dict[str, int | float] = {
    "min_rows": 200_000,
    "max_rows": 1_000_000,
    "min_bytes": 1,
    "min_age": 0.5,
    "max_age": 1,
    "limit_bytes": 1 << 30,
}
# A sustained load wants throughput, not a short tail: blocks of 200k rows or 5 s.
SUSTAIN_BUFFER: dict[str, int | float] = {**INGEST_BUFFER, "min_age": 1, "max_age": 5}
LATENCY_BUFFER: dict[str, int | float] = {
    "min_rows": 1,
    "max_rows": 100_000,
    "min_bytes": 1,
    "min_age": 0.2,
    "max_age": 0.5,
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
USERS, AMOUNTS = 50_000, 10_000
KINDS = ("click", "view", "buy", "share")
COUNTRIES = ("de", "fr", "us", "cn", "br")


Row = tuple[str, ...]
# The labels of the rows that every step timing the daemon's stages shares.
RAW = "raw librdkafka consume (baseline)"
INGEST = "ingest: Kafka -> WAL -> buffer"
END_TO_END = "end to end: -> Spark -> ClickHouse"
# The names of the CPU meter's processes: the daemon and its Spark.
DAEMON, JVM, PYTHON_WORKERS = "daemon", "its Spark JVM", "the JVM's Python workers"
PRODUCER_CPU = f"the {PRODUCER_PROCESSES}"


def message(i: int, sent_ns: int = 0) -> bytes:
    body = {
        "id": i,
        "user": f"user-{i % USERS:06d}",
        "kind": KINDS[i % len(KINDS)],
        "amount": round(i % AMOUNTS / 7, 2),
        "country": COUNTRIES[i % len(COUNTRIES)],
        "note": "x" * 106,
        "sent_ns": sent_ns,
    }
    return json.dumps(body, separators=(",", ":")).encode()


class Messages:
    """`message(i)` for any i >= 0 at a few million a second: every field but the id repeats
    with the period below, so the bytes after the id are encoded once for each residue."""

    PERIOD = math.lcm(USERS, len(KINDS), AMOUNTS, len(COUNTRIES))

    def __init__(self) -> None:
        self._tails = [message(j)[len(b'{"id":%d,' % j) :] for j in range(self.PERIOD)]

    def __call__(self, i: int) -> bytes:
        return b'{"id":%d,%s' % (i, self._tails[i % self.PERIOD])


def wait(check: Callable[[], bool], timeout: float, what: str, interval: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def settle(
    read: Callable[[], int], target: int, timeout: float, quiet: float, interval: float = 0.5
) -> int:
    """`read()` (every `interval` s) once it reaches `target`, or once it has not changed for
    `quiet` seconds, or after `timeout` seconds: a shortfall is reported, not waited out."""
    deadline = time.monotonic() + timeout
    value, changed = read(), time.monotonic()
    while value < target and time.monotonic() < min(deadline, changed + quiet):
        time.sleep(interval)
        if (now := read()) != value:
            value, changed = now, time.monotonic()
    return value


@dataclass(frozen=True)
class Load:
    """What the producer processes write together into `topic`: ids 0, 1, ... each once,
    message i on partition i % PARTITIONS, at `rate` rows/s in all (None: as fast as they
    can), until `count` are written, `seconds` have passed or they are stopped."""

    bootstrap: str
    topic: str
    rate: int | None = None
    count: int = sys.maxsize
    compression: str = "none"  # librdkafka's compression.type
    seconds: float = 600.0


@dataclass(frozen=True)
class Shared:
    """What the producer processes of one load share with the bench."""

    claimed: Synchronized[int]  # the next id to produce
    sent: Synchronized[int]  # messages handed to librdkafka
    sent_bytes: Synchronized[int]
    began: Synchronized[float]  # time.monotonic() at the go
    ready: Semaphore  # released by each process once its producer is built
    go: Event
    stop: Event


@dataclass(frozen=True)
class Produced:
    """What the producer processes of one load wrote."""

    rows: int
    mib: float
    seconds: float  # from the go until every process had its messages delivered


def next_claim(first: int, due: int, count: int) -> int:
    """Where the claim that starts at id `first` ends: up to PRODUCE_CHUNK ids of those
    below `due`, at least MIN_CLAIM of them unless the load's `count` ends sooner; `first`
    (nothing claimed) when fewer are due."""
    last = max(first, min(first + PRODUCE_CHUNK, due, count))
    return last if last - first >= MIN_CLAIM or last == count else first


def produce_load(load: Load, shared: Shared) -> None:
    """One producer process of `load`: claims PRODUCE_CHUNK ids at a time while they are due
    (at most TICK ahead of the rate), produces them and counts them in `shared.sent`; every
    message is delivered when it returns, or it raises."""
    producer = Producer(
        {
            **PRODUCER_CONFIG,
            "bootstrap.servers": load.bootstrap,
            "compression.type": load.compression,
        }
    )
    encode, produce, topic = Messages(), producer.produce_batch, load.topic
    shared.ready.release()
    if not shared.go.wait(300):
        raise RuntimeError(f"producer of {topic}: not told to start within 300 s")
    began = shared.began.value
    while not shared.stop.is_set() and (elapsed := time.monotonic() - began) < load.seconds:
        due = load.count
        if load.rate is not None:
            due = min(due, int((elapsed + TICK) * load.rate))
        with shared.claimed.get_lock():
            first = shared.claimed.value
            last = shared.claimed.value = next_claim(first, due, load.count)
        if first == last:
            if first >= load.count:
                break
            producer.poll(0)
            time.sleep(TICK / 5)
            continue
        while len(producer) > QUEUE_HIGH:  # let librdkafka send what it holds
            producer.poll(0.01)
        # One produce_batch per claim: 1.6 us of this process's CPU per message, not 2.5.
        batch: list[dict[str, Any]] = [
            {"value": encode(i), "partition": i % PARTITIONS} for i in range(first, last)
        ]
        queued = produce(topic, batch)
        if queued != len(batch):
            errors = {str(m["_error"]) for m in batch if "_error" in m}
            raise RuntimeError(f"producer of {topic}: {queued} of {len(batch)} queued: {errors}")
        size = sum(len(m["value"]) for m in batch)
        producer.poll(0)
        with shared.sent.get_lock():
            shared.sent.value += last - first
        with shared.sent_bytes.get_lock():
            shared.sent_bytes.value += size
    left = producer.flush(120)
    if left:
        raise RuntimeError(f"producer of {topic}: {left} messages undelivered after 120 s")


class Producers:
    """PRODUCERS spawned processes writing one `Load`; `producing` starts and ends them."""

    def __init__(self, load: Load) -> None:
        spawn = multiprocessing.get_context("spawn")  # no librdkafka threads cross a fork
        self.load = load
        self._shared = Shared(
            claimed=spawn.Value("q", 0),
            sent=spawn.Value("q", 0),
            sent_bytes=spawn.Value("q", 0),
            began=spawn.Value("d", 0.0),
            ready=spawn.Semaphore(0),
            go=spawn.Event(),
            stop=spawn.Event(),
        )
        self._processes = [
            spawn.Process(target=produce_load, args=(load, self._shared), daemon=True)
            for _ in range(PRODUCERS)
        ]
        self.began = 0.0  # time.monotonic() at the go

    @property
    def sent(self) -> int:
        """The messages handed to librdkafka so far."""
        return int(self._shared.sent.value)

    def alive(self) -> bool:
        return any(p.is_alive() for p in self._processes)

    @property
    def pids(self) -> list[int]:
        """The processes' ids, once started."""
        return [p.pid for p in self._processes if p.pid is not None]

    def start(self) -> None:
        """Start the processes and, once each has its producer, let them all go at once."""
        for process in self._processes:
            process.start()
        deadline = time.monotonic() + 120
        for ready in range(len(self._processes)):
            while not self._shared.ready.acquire(timeout=0.5):
                if time.monotonic() > deadline or any(
                    p.exitcode is not None for p in self._processes
                ):
                    raise SystemExit(
                        f"producers of {self.load.topic}: {ready} of {PRODUCERS} started"
                    )
        self.began = time.monotonic()
        self._shared.began.value = self.began
        self._shared.go.set()

    def join(self) -> Produced:
        """Wait until every process has ended (the load is written, its time is up or it was
        stopped) and every message is delivered; what they wrote and how long it took."""
        for process in self._processes:
            process.join(self.load.seconds + 300)
        took = time.monotonic() - self.began
        failed = [p.exitcode for p in self._processes if p.exitcode != 0]
        if failed:
            raise SystemExit(f"producers of {self.load.topic} failed (exit codes {failed})")
        return Produced(self.sent, self._shared.sent_bytes.value / MIB, took)

    def close(self) -> None:
        """Stop the processes, however far they got; terminate any that do not end."""
        self._shared.stop.set()
        for process in self._processes:
            if process.pid is not None:
                process.join(130)
                if process.is_alive():
                    process.terminate()
                    process.join(10)


@contextlib.contextmanager
def producing(load: Load) -> Iterator[Producers]:
    """The producers of `load`, just told to go; stopped on leaving, however that is."""
    producers = Producers(load)
    try:
        producers.start()
        yield producers
    finally:
        producers.close()


def produce_backlog(bootstrap: str, topic: str, count: int) -> Produced:
    """`count` messages written into `topic` as fast as the producers can."""
    with producing(Load(bootstrap, topic, count=count)) as producers:
        produced = producers.join()
    if produced.rows != count:
        raise SystemExit(f"producers of {topic}: {produced.rows:,} of {count:,} messages written")
    return produced


def served_from(bootstrap: str, topic: str, partition: int, offset: int) -> str:
    """The offset of the first message the broker hands out for `offset` of `partition`, as
    text ("nothing" if none comes in 10 s)."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "bench-check", "enable.auto.commit": False}
    )
    try:
        consumer.assign([TopicPartition(topic, partition, offset)])
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            for message in consumer.consume(1, 0.5):
                if message.error() is None:
                    return f"{message.offset():,}"
        return "nothing"
    finally:
        consumer.close()


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


def speed(rows: float, mib: float, seconds: float) -> tuple[str, str]:
    """The rows/s and MiB/s cells of `rows` rows of `mib` MiB in `seconds`."""
    return f"{rows / seconds:,.0f} rows/s", f"{mib / seconds:.1f} MiB/s"


def rate_row(label: str, timed: int, mib: float, seconds: float, raw_per_row: float) -> Row:
    """`timed` rows of `mib` MiB in `seconds`, with the raw consume time per row as the base."""
    return (label, *speed(timed, mib, seconds), f"{raw_per_row * timed / seconds:.2f}")


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


def cpu_meter(node: DaemonNode, others: Mapping[str, int | Sequence[int]]) -> CpuMeter:
    """A meter of the node's daemon with its lane processes (its other children, as they are
    now), its Spark JVM (a child, if running) and the JVM's Python workers (the processes
    below it), and the `others` (the stack, the producers)."""
    daemon = node.pid
    assert daemon is not None
    pids: dict[str, int | list[int]] = {}
    lanes: list[int] = []
    below = {}
    for child in children(daemon):
        if "java" in " ".join(pid_cmdline(child)):
            pids[JVM] = child
            below[PYTHON_WORKERS] = child
        else:
            lanes.append(child)
    return CpuMeter({DAEMON: [daemon, *lanes], **pids, **others}, below)


def cpu_rows(cpu: CpuUse) -> list[Row]:
    """Table rows saying where the cores went: the daemon by thread, the other processes, and
    the rest of the machine (kernel, ZooKeeper, this bench)."""
    daemon = cpu.processes[DAEMON]
    two = " + ".join(f"{c:.2f}" for c in daemon.busiest[:2])
    rows: list[Row] = [
        (
            f"  CPU: {DAEMON}",
            f"{daemon.cores:.2f} cores",
            f"2 busiest threads {two}",
            f"librdkafka {daemon.rdkafka:.2f}",
        )
    ]
    rows += [
        (f"  CPU: {name}", f"{use.cores:.2f} cores", "", "")
        for name, use in cpu.processes.items()
        if name != DAEMON
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


def per_core_rows(cpu: CpuUse, rows: int, mib: float) -> list[Row]:
    """`rows` rows of `mib` MiB over the interval of `cpu`, per core the daemon and its Spark
    used meanwhile, next to clickhouse_sinker's published figure per core."""
    spark = (DAEMON, JVM, PYTHON_WORKERS)
    if missing := [name for name in spark if name not in cpu.processes]:
        raise SystemExit(f"per core: no {' and no '.join(missing)} to read the CPU of")
    used = [cpu.processes[name].cores for name in spark]
    core_seconds = sum(used) * cpu.seconds
    sinker_rows = SINKER_ROWS / SINKER_CPUS
    sinker_mib = sinker_rows * SINKER_BYTES / MIB
    return [
        (
            "  end to end per core of the daemon and its Spark",
            *speed(rows, mib, core_seconds),
            f"{sum(used):.2f} cores: " + " + ".join(f"{c:.2f}" for c in used),
        ),
        (
            f"  clickhouse_sinker, published ({SINKER_BYTES} B JSON)",
            *speed(sinker_rows, sinker_mib, 1),
            f"{SINKER_ROWS // 1000}k rows/s on {SINKER_CPUS} CPUs; ours "
            f"{rows / core_seconds / sinker_rows:.2f}x its rows, "
            f"{mib / core_seconds / sinker_mib:.2f}x its MiB",
        ),
    ]


@dataclass(frozen=True)
class Step:
    """What one step's cluster differs in; `running` does the rest alike for every step."""

    name: str  # of its folder, its topic `e2e_<name>` and its ClickHouse database
    buffer: dict[str, int | float] = field(default_factory=lambda: INGEST_BUFFER)
    nodes: dict[str, list[int]] = field(default_factory=lambda: {"n1": [0, 1]})
    spark_on_followers: bool = False
    backlog: int = 0  # messages produced before the daemons start
    leaders: bool = True  # wait until both shards' leaders consume before the step's body
    lanes: int | str = "auto"  # the pipeline's `lanes`


@dataclass(frozen=True)
class Fill:
    """The node consuming a backlog, timed from its first consumed batch (what came before it
    is startup, not ingest)."""

    began: float  # perf_counter at the first consumed batch
    rows: int  # the rows consumed after it: the ones timed
    mib: float  # their share of the backlog's MiB
    seconds: float
    cpu: CpuUse  # over those seconds
    meter: CpuMeter  # read again for a longer interval from the same start


@dataclass
class StepCluster:
    """A step's cluster, its topic and ClickHouse database, and the MiB of the backlog
    produced before it started (0 if none); `running` makes one."""

    bench: Bench
    cluster: LocalCluster
    topic: str
    database: str
    backlog_mib: float

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
        """Seconds from `began` (a perf_counter) until ClickHouse holds `count` rows; exits
        naming the shortfall when the count stops short for 30 s."""
        landed = settle(self.clickhouse_rows, count, 900, 30, 0.25)
        if landed < count:
            raise SystemExit(
                f"{count - landed:,} of {count:,} rows never reached ClickHouse: {self.missing()}"
            )
        return time.perf_counter() - began

    def missing(self, limit: int = 3) -> str:
        """The first `limit` stretches of offsets missing from ClickHouse below each
        partition's last, and the offset the broker hands out when asked for each one's
        first: the same offset if it still serves them (the daemon lost them), a later one
        if it does not."""
        stretches = self.client.query(
            "SELECT _partition, prev + 1, _offset - 1 FROM (SELECT _partition, _offset, "
            "lagInFrame(_offset, 1, -1) OVER (PARTITION BY _partition ORDER BY _offset "
            "ROWS BETWEEN 1 PRECEDING AND CURRENT ROW) AS prev FROM events) "
            f"WHERE _offset - prev > 1 ORDER BY _partition, _offset LIMIT {limit}"
        ).result_rows
        if not stretches:
            return "no stretch below a partition's last offset (missing at the ends)"
        return "; ".join(
            f"p{p} {first:,}-{last:,} (the broker serves "
            f"{served_from(self.bench.stack.kafka, self.topic, p, first)})"
            for p, first, last in stretches
        )

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
        return Fill(began, timed, self.backlog_mib * timed / count, seconds, cpu, meter)

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
        name="events",
        topic=topic,
        table="events",
        columns=COLUMNS,
        buffer=step.buffer,
        lanes=step.lanes,
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
    mib = produce_backlog(bench.stack.kafka, topic, step.backlog).mib if step.backlog else 0.0
    try:
        cluster.start()
        if step.leaders:
            cluster.wait_leaders([0, 1])
        yield StepCluster(bench, cluster, topic, database, mib)
    finally:
        cluster.stop()


def ingest(bench: Bench) -> list[Row]:
    """The producers writing as fast as they can while the daemon consumes (its Spark session
    up): the rates into the buffer and into ClickHouse next to the producers' and a raw
    consume's, and the daemon's peak RSS against its buffer limit."""
    with running(bench, Step("ingest")) as step:
        step.warm_up(Producer({"bootstrap.servers": bench.stack.kafka}))
        # The clock starts with the producers: the daemon consumes while they produce.
        with producing(Load(bench.stack.kafka, step.topic, count=BACKLOG)) as producers:
            began = time.perf_counter()
            produced = producers.join()
        buffered = step.until_consumed(BACKLOG + 1, began, 600, "the backlog in the buffer")
        flushed = step.until_in_clickhouse(BACKLOG + 1, began)
        rss = memory_mib(step.pid)
    raw = step.baseline(BACKLOG + 1)
    mib, per_row, limit = produced.mib, raw / BACKLOG, INGEST_BUFFER["limit_bytes"] / MIB
    return [
        (f"ingest of {BACKLOG:,} messages while they are produced:", "", "", ""),
        rate_row("  producers, unpaced", BACKLOG, mib, produced.seconds, per_row),
        rate_row(f"  {RAW}", BACKLOG, mib, raw, per_row),
        rate_row(f"  {INGEST}", BACKLOG, mib, buffered, per_row),
        rate_row(f"  {END_TO_END}", BACKLOG, mib, flushed, per_row),
        (
            "  peak RSS of the daemon (VmHWM)",
            f"{rss:,.0f} MiB",
            f"limit {limit:,.0f} MiB",
            f"{rss / limit:.2f}",
        ),
    ]


@dataclass
class Run:
    """The options of one run, and what later steps take from the catch-up."""

    sustain_seconds: float
    sustain_rate: int | None  # rows/s; None: SUSTAIN_SHARE of the catch-up's end to end
    catchup_backlog: int
    lanes: tuple[int | str, ...] = ("auto",)  # the catch-up's `lanes`, one catch-up each
    catchup_e2e: float | None = None  # rows/s of the last catch-up, once one has run

    def target(self) -> tuple[int, str]:
        """The sustained rate in rows/s, and where it comes from."""
        if self.sustain_rate is not None:
            return self.sustain_rate, "--sustain-rate"
        if self.catchup_e2e is None:
            raise SystemExit(
                "the sustained rate is a share of the catch-up's end-to-end rate: "
                "run the catchup step before it or give --sustain-rate"
            )
        return int(SUSTAIN_SHARE * self.catchup_e2e), f"{SUSTAIN_SHARE} x catch-up end to end"

    def against_catchup(self, rows_per_s: float) -> str:
        """A ratio cell: `rows_per_s` against the catch-up's end-to-end rate, if measured."""
        if self.catchup_e2e is None:
            return "no catch-up in this run"
        return f"{rows_per_s / self.catchup_e2e:.2f} of catch-up e2e"


def catchup(bench: Bench, run: Run) -> list[Row]:
    """One catch-up per value of `run.lanes`, each with its own backlog, cluster and raw
    consume baseline."""
    rows: list[Row] = []
    for lanes in run.lanes:
        name = "catchup" if len(run.lanes) == 1 else f"catchup_lanes_{lanes}"
        rows += catchup_once(bench, run, name, lanes)
    return rows


def catchup_once(bench: Bench, run: Run, name: str, lanes: int | str) -> list[Row]:
    """The daemon's own ingest rate: a backlog produced before it starts (no producer competes
    for the cores), Spark up before it stands for election; timed from its first consumed
    batch, next to a raw consume of the same backlog, with where the CPU went until the last
    row was in ClickHouse and what that is per core of the daemon and its Spark."""
    count = run.catchup_backlog
    spec = Step(name, spark_on_followers=True, backlog=count, leaders=False, lanes=lanes)
    with running(bench, spec) as step:
        fill = step.fill(count, 600, "the backlog in the buffer")
        flushed = step.until_in_clickhouse(count, fill.began)
        cpu = fill.meter.stop()
    raw = step.baseline(count)
    per_row = raw / count
    run.catchup_e2e = fill.rows / flushed
    return [
        (f"catch-up of {count:,} messages produced first, lanes = {lanes}:", "", "", ""),
        rate_row(f"  {RAW}", count, step.backlog_mib, raw, per_row),
        rate_row(f"  {INGEST}", fill.rows, fill.mib, fill.seconds, per_row),
        rate_row(f"  {END_TO_END}", fill.rows, fill.mib, flushed, per_row),
        (
            "  last row in ClickHouse after the last in the buffer",
            f"{flushed - fill.seconds:.1f} s",
            f"max_age {INGEST_BUFFER['max_age']} s",
            "",
        ),
        *per_core_rows(cpu, fill.rows, fill.mib),
        ("  CPU from the first consumed batch to the last row in ClickHouse:", "", "", ""),
        *cpu_rows(cpu),
    ]


def producer_probe(bench: Bench, target: int) -> Row:
    """The producers alone (no daemon runs) for PROBE_SECONDS as fast as they can, into a
    topic of their own: a sustained rate they cannot reach would be theirs, not the daemon's."""
    topic = "e2e_producers"
    create_topic(bench.stack.kafka, topic, PARTITIONS)
    probe = Load(bench.stack.kafka, topic, seconds=PROBE_SECONDS, compression=SUSTAIN_COMPRESSION)
    with producing(probe) as producers:
        produced = producers.join()
    return (
        f"  producers alone first, {PROBE_SECONDS:.0f} s unpaced",
        *speed(produced.rows, produced.mib, produced.seconds),
        f"{produced.rows / produced.seconds / target:.2f} of the sustained target",
    )


@dataclass(frozen=True)
class Sample:
    """The sustained step at one moment."""

    at: float  # s since the producers started
    sent: int
    consumed: int
    in_clickhouse: int
    rss: float  # MiB
    flushed: int  # rows, by the daemon's counters
    flushes: int

    @property
    def lag(self) -> int:
        """Rows produced but not yet in ClickHouse."""
        return self.sent - self.in_clickhouse


def sustained(bench: Bench, run: Run) -> list[Row]:
    """The producers at the target rate for `run.sustain_seconds` (after the probe of their
    own rate): the produced, ingest and end-to-end rates over the run after its first minute
    (of its first quarter, if shorter), where the CPU went meanwhile, and the daemon's RSS and
    the lag into ClickHouse from that minute to the end."""
    (target, source), seconds = run.target(), run.sustain_seconds
    start = min(60.0, seconds / 4)
    probe = producer_probe(bench, target)
    samples: list[Sample] = []
    meter: CpuMeter | None = None
    cpu: CpuUse | None = None  # over the samples from `start` to `seconds`
    with running(bench, Step("sustained", SUSTAIN_BUFFER, spark_on_followers=True)) as step:
        step.warm_up(Producer({"bootstrap.servers": bench.stack.kafka}))
        warm = step.clickhouse_rows()  # the warm-up record
        load = Load(
            bench.stack.kafka,
            step.topic,
            rate=target,
            seconds=seconds,
            compression=SUSTAIN_COMPRESSION,
        )
        with producing(load) as producers:
            while producers.alive():
                sample = Sample(
                    time.monotonic() - producers.began,
                    producers.sent,
                    int(consumed(step.node)) - warm,
                    step.clickhouse_rows() - warm,
                    memory_mib(step.pid, "VmRSS"),
                    int(metric(step.node, "hakafka_flush_rows_total")),
                    int(metric(step.node, "hakafka_flushes_total")),
                )
                samples.append(sample)
                if meter is None and sample.at >= start:
                    meter = cpu_meter(step.node, {**bench.pids, PRODUCER_CPU: producers.pids})
                    meter.start()
                elif meter is not None and sample.at <= seconds:
                    cpu = meter.stop()
                time.sleep(SAMPLE_EVERY)
            total = producers.join().rows
        drain_began = time.monotonic()
        landed = settle(lambda: step.clickhouse_rows() - warm, total, 300, 30)
        drained = time.monotonic() - drain_began
        missing = step.missing() if landed < total else ""
    window = [s for s in samples if start <= s.at <= seconds]
    if len(window) < 2 or cpu is None:
        raise SystemExit(f"sustained: {len(window)} samples in the window, run longer")
    first, last = window[0], window[-1]
    span = last.at - first.at
    mib_per_row = len(message(0)) / MIB
    produced = (last.sent - first.sent) / span
    rows: list[Row] = [
        (f"sustained {seconds:.0f} s at {target:,} rows/s ({source}):", "", "", ""),
        probe,
        (
            f"  {PRODUCER_PROCESSES}, paced, {SUSTAIN_COMPRESSION}",
            *speed(produced, produced * mib_per_row, 1),
            f"{produced / target:.2f} of the target",
        ),
    ]
    for what, count in ((INGEST, "consumed"), (END_TO_END, "in_clickhouse")):
        per_s = (getattr(last, count) - getattr(first, count)) / span
        rows.append(
            (f"  {what}", *speed(per_s, per_s * mib_per_row, 1), run.against_catchup(per_s))
        )
    flushes = last.flushes - first.flushes
    block = (last.flushed - first.flushed) // max(flushes, 1)
    rss_change = last.rss / first.rss - 1
    return [
        *rows,
        (
            f"  RSS of the daemon, {first.at:.0f} s -> {last.at:.0f} s",
            f"{first.rss:,.0f} -> {last.rss:,.0f} MiB",
            f"min {min(s.rss for s in window):,.0f} max {max(s.rss for s in window):,.0f}",
            f"end {rss_change:+.1%}: "
            + ("within" if abs(rss_change) <= 0.1 else "NOT within")
            + " 10%",
        ),
        (
            f"  lag into ClickHouse, {first.at:.0f} s -> {last.at:.0f} s",
            f"{first.lag:,} -> {last.lag:,} rows",
            f"max {max(s.lag for s in window):,} rows",
            f"{flushes} blocks of {block:,} rows: "
            + ("does not grow" if last.lag <= first.lag + block else "GROWS (> one block)"),
        ),
        (
            "  drain after the producers ended",
            f"{drained:.1f} s",
            f"{landed:,} of {total:,} produced rows in ClickHouse",
            "every row" if landed == total else f"{total - landed:+,} MISSING: {missing}",
        ),
        (f"  CPU from {first.at:.0f} s to {last.at:.0f} s:", "", "", ""),
        *cpu_rows(cpu),
    ]


def latency(bench: Bench, run: Run) -> list[Row]:
    """Single timestamped messages at a low rate: how long until each is queryable in the
    leader's buffer (every one) and counted in ClickHouse (every tenth); then the same into
    ClickHouse under a load of half the sustained rate."""
    load_rate = run.target()[0] // 2
    producer = Producer({"bootstrap.servers": bench.stack.kafka, "linger.ms": 0})
    to_buffer: list[float] = []
    to_clickhouse: list[float] = []
    with running(bench, Step("latency", buffer=LATENCY_BUFFER)) as step:
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
        loaded = under_load(step, producer, load_rate)
    rows: list[Row] = []
    for what, samples, note in (
        ("produce -> queryable in buffer", to_buffer, f"query floor {floor * 1000:.1f} ms"),
        ("produce -> visible in ClickHouse", to_clickhouse, f"query floor {floor * 1000:.1f} ms"),
        (
            f"  at half the sustained rate, {load_rate:,} rows/s",
            loaded.latencies,
            f"load {loaded.rate:,.0f} rows/s; a query every {PROBE_POLL * 1000:.0f} ms"
            f" + {loaded.query * 1000:.0f} ms",
        ),
    ):
        q = statistics.quantiles(samples, n=100, method="inclusive")
        rows.append(
            (
                f"{what} ({len(samples)} msgs)",
                f"p50 {q[49] * 1000:,.0f} ms",
                f"p99 {q[98] * 1000:,.0f} ms",
                note,
            )
        )
    return rows


@dataclass(frozen=True)
class UnderLoad:
    latencies: list[float]  # s from each probe's `sent_ns` until a query returned it
    rate: float  # rows/s the producers reached meanwhile
    query: float  # s, the median of the queries looking for the probes


def under_load(step: StepCluster, probe: Producer, rate: int) -> UnderLoad:
    """With the producers writing `rate` rows/s into the step's topic, LOADED_PROBES messages
    sent with `probe` PROBE_EVERY apart, each looked for in ClickHouse every PROBE_POLL by its
    partition and offset until a query returns it."""
    delivered: set[tuple[int, int]] = set()  # (partition, offset) of probes not seen yet

    def on_delivery(error: Any, msg: Any) -> None:
        if error is not None:
            raise SystemExit(f"probe message undelivered: {error}")
        delivered.add((msg.partition(), msg.offset()))

    seen: list[float] = []
    queries: list[float] = []
    load = Load(step.bench.stack.kafka, step.topic, rate=rate)
    with producing(load) as producers:
        time.sleep(LOAD_SETTLE)
        began, sent_before = time.monotonic(), producers.sent
        deadline = began + LOADED_PROBES * PROBE_EVERY + 60
        sent = 0
        while len(seen) < LOADED_PROBES:
            if time.monotonic() > deadline:
                raise SystemExit(f"{len(seen)} of {LOADED_PROBES} probes in ClickHouse in time")
            if sent < LOADED_PROBES and time.monotonic() >= began + sent * PROBE_EVERY:
                value = message(-2 - sent, time.time_ns())  # ids apart from the load's
                probe.produce(
                    step.topic, value, partition=sent % PARTITIONS, on_delivery=on_delivery
                )
                sent += 1
            probe.poll(0)
            if delivered:
                keys = ", ".join(f"({p}, {o})" for p, o in delivered)
                asked = time.perf_counter()
                found = step.client.query(
                    "SELECT _partition, _offset, sent_ns FROM events"
                    f" WHERE (_partition, _offset) IN ({keys})"
                ).result_rows
                now = time.time_ns()
                queries.append(time.perf_counter() - asked)
                for partition, offset, sent_ns in found:
                    delivered.discard((partition, offset))
                    seen.append((now - sent_ns) / 1e9)
            time.sleep(PROBE_POLL)
        reached = (producers.sent - sent_before) / (time.monotonic() - began)
    return UnderLoad(seen, reached, statistics.median(queries))


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
    parser.add_argument(
        "--sustain-rate",
        type=int,
        help=f"rows/s (default: {SUSTAIN_SHARE} of the catch-up's end-to-end rate of this run)",
    )
    parser.add_argument("--catchup-backlog", type=int, default=CATCHUP_BACKLOG, help="messages")
    parser.add_argument(
        "--lanes",
        type=lambda v: tuple(x if x == "auto" else int(x) for x in v.split(",")),
        default=("auto",),
        help='the catch-up pipeline\'s lanes ("auto": one per partition, at most the cores); '
        "a list such as 1,2 runs one catch-up per value",
    )
    parser.add_argument(
        "--steps",
        default="ingest,catchup,sustained,latency,failover,restart",
        help="in this order; sustained and latency take their rate from catchup",
    )
    args = parser.parse_args()
    run = Run(args.sustain_seconds, args.sustain_rate, args.catchup_backlog, args.lanes)
    steps: dict[str, Callable[[Bench], list[Row]]] = {
        "ingest": ingest,
        "catchup": functools.partial(catchup, run=run),
        "sustained": functools.partial(sustained, run=run),
        "latency": functools.partial(latency, run=run),
        "failover": failover,
        "restart": restart,
    }
    names = args.steps.split(",")
    if unknown := set(names) - set(steps):
        parser.error(f"--steps: no step {', '.join(sorted(unknown))} (steps: {', '.join(steps)})")
    configure_logs("console", "warning")  # the table, not the ops client's connection events
    rows: list[Row] = []
    try:
        with local_stack("hakafka-e2e-bench-") as bench:
            for name in names:
                print(f"... {name}", file=sys.stderr, flush=True)
                rows += steps[name](bench)
    finally:
        report(rows)
    return 0


def report(rows: list[Row]) -> None:
    print(
        f"e2e bench: JSON messages of ~{len(message(0))} B from {PRODUCER_PROCESSES}, "
        f"{PARTITIONS} partitions, one daemon leading 2 shards, {os.cpu_count()} cores shared "
        "by broker, ClickHouse, Spark, the daemon and the producers"
    )
    if not rows:
        return
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        print("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(r)))
    print("ratio column: raw consume time / stage time (ingest), or the baseline named")


if __name__ == "__main__":
    sys.exit(main())
