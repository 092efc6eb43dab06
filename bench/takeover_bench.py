"""Leader takeover under load, with real daemons: how long a shard goes without a consuming
leader, and without a checkpoint, after the leader is lost in the middle of a flush.

One shard (shard 0 of 2: 4 of the topic's 8 partitions) served by two `hakafka run` daemons,
n1 and n2, on the local stack. A producer in its own process writes RATE small JSON events a
second to the shard's partitions for the whole run, and the blocks are small (sealed at
>= 5,000 rows and >= 0.5 s), so a flush is nearly always under way. Each fault is fired only
while the shard's `pending` intent exists (polled; at most PENDING_WAIT_S s), i.e. while a
block is between its intent and its checkpoint:

- ops failover: `Coordinator.request_failover` to the other node (the leader finishes its
  block within the 20 s grace, resigns, the other one takes over);
- kill -9: SIGKILL of the leader; the killed node is started again after the round;
- SIGSTOP: the leader is frozen for twice the session timeout, then continued (its session
  has expired by then: it steps down and stands again).

Per round, from the fault to: the other node elected (its `leader` znode created), consuming
(the znode says `consuming`), and its first checkpoint (the `checkpoint` znode modified after
that `leader` znode was created: only the new term can write it). The times are the znodes'
own ctime/mtime, stamped by the ZooKeeper server on this machine's clock, so polling does not
blur them. Every fault kind runs ROUNDS rounds with `spark.on_followers = true` (the default
since #31: every node keeps its Spark session and Python workers warm; a round waits until
the standby says its flush path is warm, as a restarted one does ~10 s after its start) and
again with `false` (the previous default: a node starts Spark when it first leads), whose
standby is restarted before each round unless it is fresh, so that every round times that
deployment's standby, one without Spark (`--warm-standby` keeps it).

After the rounds of a setting: the memory of the leader's and the standby's process trees
(daemon, Spark's JVM, its Python workers: summed RSS, and PSS, which counts a page shared by
forked workers once), a `false` standby being a daemon without Spark; then STARTS times both
daemons stopped and started together (a whole host starting), timed from the processes'
start to a leader elected, consuming, and its first checkpoint.

Beside the figures: the session timeout, a raw baseline measured in the same run under the same
load (one znode delete seen by another client's watch: the floor of any hand-over), the steady
flush time (intent -> checkpoint, from the daemons' `flush.committed` events, each term's first
left out: it waits for Spark or re-flushes) and the targets (ops failover -> consuming < 1 s;
kill -9 -> consuming < session timeout + 1 s; only printed). At the end of each setting the
producer stops, every produced offset is awaited in the checkpoint, and ClickHouse is counted:
every produced (_partition, _offset) exactly once (the produced offsets come from the delivery
reports). Rows lost, duplicated or unexpected make the exit code 1.

Run: PYTHONPATH=. .venv/bin/python bench/takeover_bench.py [--rounds N] [--faults ops,kill,stop]
     [--on-followers true,false] [--rate MSGS_PER_S] [--warm-standby]  (about 12 minutes)
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import signal
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from benchstack import Bench, ZkView, local_stack
from confluent_kafka import Producer
from e2e_bench import (
    PARTITIONS,
    SESSION_TIMEOUT,
    SHARDS,
    ZK_ROOT,
    Step,
    StepCluster,
    message,
    running,
    wait,
)
from failover_bench import watch_baseline
from kazoo.exceptions import NoNodeError
from memory_use import MIB, TreeMemory, tree_memory

from devstack.chaos.checks import log_events
from devstack.cluster import DaemonNode
from devstack.records import Tally, tally
from hakafka.coordination import Coordinator, LeaderInfo, NodeInfo, ZkConfig, paths
from hakafka.coordination.records import Checkpoint, decode_checkpoint
from hakafka.logs import configure as configure_logs

SHARD = 0
OWNED = [p for p in range(PARTITIONS) if p % SHARDS == SHARD]  # the shard's 4 partitions
PIPELINE = "events"
NODES = ("n1", "n2")
RATE = 5_000  # messages/s
ROUNDS = 5
# Seal a block at >= 5,000 rows once its oldest row is >= 0.5 s old (or at 2 s whatever the
# rows): about one block a second at RATE, so a flush is nearly always in flight.
BUFFER: dict[str, int | float] = {"min_rows": 5_000, "min_bytes": 1, "min_age": 0.5, "max_age": 2}
PENDING_WAIT_S = 30.0
ROUND_TIMEOUT_S = 180.0  # fault -> first checkpoint of the new leader
READY_TIMEOUT_S = 180.0  # a restarted node standing again (with Spark first, if on followers)
DRAIN_TIMEOUT_S = 180.0
FROZEN_S = 2 * SESSION_TIMEOUT
OPS_TARGET_S = 1.0
KILL_TARGET_S = SESSION_TIMEOUT + 1.0
POLL_S = 0.02
STARTS = 2  # whole-node starts (both daemons at once) per setting
MEMORY_SETTLE_S = 10.0  # after the standby is warm, before its memory is read
FAULTS = {
    "ops": "ops failover",
    "kill": "kill -9",
    "stop": f"SIGSTOP {FROZEN_S:.0f} s",
}

Row = tuple[str, str, str, str]


def steady_producer(
    bootstrap: str, topic: str, rate: int, *, stop: Any, sent: Any, undelivered: Any, ends: Any
) -> None:
    """Produce `rate` messages a second round-robin over the shard's partitions (in 50 ms
    ticks, catching up when behind) until `stop` is set, then flush. Keeps the shared
    counters current: `sent`, `undelivered`, and per partition of OWNED the end (last offset
    + 1) of what the broker acknowledged, from the delivery reports (tansu's high watermark
    lags behind the last batch). Runs in its own process."""
    failed = [0]
    end = [0] * len(OWNED)

    def delivered(err: Any, msg: Any) -> None:
        if err is not None:
            failed[0] += 1
        else:
            index = OWNED.index(msg.partition())
            end[index] = max(end[index], msg.offset() + 1)

    def publish(left: int = 0) -> None:
        sent.value, undelivered.value = i, failed[0] + left
        ends[:] = end

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1 << 20})
    began = time.monotonic()
    i = 0
    while not stop.is_set():
        due = int((time.monotonic() - began) * rate) + rate // 20
        while i < due:
            try:
                partition = OWNED[i % len(OWNED)]
                producer.produce(
                    topic, value=message(i), partition=partition, on_delivery=delivered
                )
                i += 1
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
        publish()
        stop.wait(0.05)
    publish(producer.flush(60))


@dataclass
class Production:
    """The producer process of one setting; `stop` ends it (idempotent)."""

    process: Any
    stop_event: Any
    sent: Any
    undelivered: Any
    ends: Any  # per partition of OWNED: the last acknowledged offset + 1
    began: float = field(default_factory=time.monotonic)
    seconds: float = 0.0

    def stop(self) -> None:
        if self.seconds:
            return
        self.stop_event.set()
        self.process.join(90)
        self.seconds = time.monotonic() - self.began
        if self.process.is_alive():
            self.process.terminate()  # our own child, by its handle
            self.process.join(10)
        if self.process.exitcode != 0:
            raise SystemExit(f"takeover producer failed (exit code {self.process.exitcode})")

    def rate(self) -> float:
        return float(self.sent.value) / (self.seconds or time.monotonic() - self.began)

    def offsets(self) -> dict[int, int]:
        """Partition -> the end of its acknowledged offsets (they start at 0: a new topic)."""
        return dict(zip(OWNED, self.ends[:], strict=True))


@contextlib.contextmanager
def producing(bootstrap: str, topic: str, rate: int) -> Iterator[Production]:
    spawn = multiprocessing.get_context("spawn")  # no librdkafka threads cross a fork
    stop, sent, undelivered = spawn.Event(), spawn.Value("q", 0), spawn.Value("q", 0)
    ends = spawn.Array("q", len(OWNED))
    process = spawn.Process(
        target=steady_producer,
        args=(bootstrap, topic, rate),
        kwargs={"stop": stop, "sent": sent, "undelivered": undelivered, "ends": ends},
        daemon=True,
    )
    process.start()
    production = Production(process, stop, sent, undelivered, ends)
    try:
        yield production
    finally:
        production.stop()


class ShardView(ZkView):
    """Shard 0's znodes, read from a ZooKeeper session of the bench's own."""

    def leader(self) -> tuple[LeaderInfo, Any] | None:
        """The leader record and its znode stat, or None while there is no leader."""
        path = paths.leader(SHARD)
        try:
            data, stat = self.client.get(path)
        except NoNodeError:
            return None
        return LeaderInfo.decode(path, data), stat

    def consuming_leader(self) -> str | None:
        got = self.leader()
        return got[0].node if got is not None and got[0].status == "consuming" else None

    def candidates(self) -> set[str]:
        """The nodes standing in the shard's election."""
        election = paths.election(SHARD)
        found = set()
        for name in self.client.get_children(election):
            with contextlib.suppress(NoNodeError):
                found.add(self.client.get(f"{election}/{name}")[0].decode())
        return found

    def pending(self) -> bool:
        return self.client.exists(paths.pending(SHARD, PIPELINE)) is not None

    def checkpoint_stat(self) -> Any:
        return self.client.exists(paths.checkpoint(SHARD, PIPELINE))

    def checkpoint(self) -> Checkpoint:
        path = paths.checkpoint(SHARD, PIPELINE)
        try:
            return decode_checkpoint(path, self.client.get(path)[0])
        except NoNodeError:
            return {}

    def wait_pending(self, timeout: float) -> bool:
        """True as soon as a flush intent exists; False if none appeared within `timeout`."""
        deadline = time.monotonic() + timeout
        while not self.pending():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.005)
        return True


@dataclass(frozen=True)
class Takeover:
    """One round: seconds from the fault to the other node elected, consuming, checkpointed."""

    fault: str
    victim: str
    successor: str
    pending: bool  # a flush intent existed when the fault was fired
    left: bool  # ... and still existed right after it (the successor must re-flush it)
    cold: bool  # the successor's flush path was not warm at the fault (no Spark session)
    elected: float
    consuming: float
    checkpoint: float


def ms(seconds: float) -> str:
    return f"{seconds * 1000:,.0f} ms"


@dataclass
class Setting:
    """One `spark.on_followers` setting's run: its rounds and what was measured beside them."""

    on_followers: bool
    baseline: list[float] = field(default_factory=list)
    flushes: list[float] = field(default_factory=list)  # steady flushes, intent -> checkpoint
    reflushes: int = 0  # pending blocks re-flushed by a new leader
    takeovers: list[Takeover] = field(default_factory=list)
    restarts: Counter[str] = field(default_factory=Counter)  # why daemons were restarted
    produced: int = 0
    rate: float = 0.0
    undelivered: int = 0
    drained: bool = True
    counted: Tally | None = None
    memory: dict[str, TreeMemory] = field(default_factory=dict)  # role -> its process tree
    starts: list[tuple[float, float, float]] = field(default_factory=list)  # whole-node starts

    def rows(self, faults: list[str]) -> list[Row]:
        setting = "true (the default)" if self.on_followers else "false (the previous default)"
        rows: list[Row] = [
            (f"spark.on_followers = {setting}", "", "", ""),
            (
                "  raw baseline: znode delete -> another client's watch",
                f"median {ms(statistics.median(self.baseline))}",
                f"max {ms(max(self.baseline))}",
                f"{len(self.baseline)} samples under load",
            ),
        ]
        if self.flushes:
            rows.append(
                (
                    "  steady flush: intent -> checkpoint (not a term's first)",
                    f"median {ms(statistics.median(self.flushes))}",
                    f"max {ms(max(self.flushes))}",
                    f"{len(self.flushes)} blocks, {self.reflushes} re-flushed by a new leader",
                )
            )
        for kind in faults:
            done = [t for t in self.takeovers if t.fault == kind]
            if not done:
                continue
            n = len(done)
            pending = sum(t.pending for t in done)
            left = f", left for the new leader {sum(t.left for t in done)}/{n}"
            notes = {
                "elected": (
                    f"floor: watch {ms(statistics.median(self.baseline))}"
                    if kind == "ops"
                    else f"floor: session {ms(SESSION_TIMEOUT)}"
                ),
                "consuming": {
                    "ops": f"target < {ms(OPS_TARGET_S)}",
                    "kill": f"target < {ms(KILL_TARGET_S)} (session + 1 s)",
                }.get(kind, ""),
                "checkpoint": (
                    f"intent at fault {pending}/{n}{left if kind != 'ops' else ''}, "
                    f"new leader without Spark {sum(t.cold for t in done)}/{n}"
                ),
            }
            for what, label in (
                ("elected", "new leader elected"),
                ("consuming", "new leader consuming"),
                ("checkpoint", "its first checkpoint"),
            ):
                samples = [getattr(t, what) for t in done]
                rows.append(
                    (
                        f"  {FAULTS[kind]} -> {label}",
                        f"median {ms(statistics.median(samples))}",
                        f"max {ms(max(samples))}",
                        notes[what],
                    )
                )
        for i, label in enumerate(("a leader elected", "consuming", "its first checkpoint")):
            if self.starts:
                samples = [start[i] for start in self.starts]
                rows.append(
                    (
                        f"  both daemons started together -> {label}",
                        f"median {ms(statistics.median(samples))}",
                        f"max {ms(max(samples))}",
                        f"{len(samples)} starts, from the processes' start" if i == 0 else "",
                    )
                )
        for role, memory in self.memory.items():
            rows.append(
                (
                    f"  memory: {role}",
                    f"RSS {memory.rss / MIB:,.0f} MiB",
                    f"PSS {memory.pss / MIB:,.0f} MiB",
                    f"{memory.processes} processes (daemon, JVM, Python workers)"
                    if memory.processes > 1
                    else "1 process",
                )
            )
        rows.append(
            (
                "  producer (own process)",
                f"{self.rate:,.0f} msg/s",
                f"{self.produced:,} messages",
                f"{self.undelivered} undelivered",
            )
        )
        if self.restarts:
            rows.append(
                (
                    "  daemons restarted between rounds",
                    f"{sum(self.restarts.values())}",
                    "",
                    ", ".join(f"{n} {why}" for why, n in sorted(self.restarts.items())),
                )
            )
        if self.counted is not None:
            c = self.counted
            rows.append(
                (
                    "  ClickHouse: every produced (_partition, _offset) once",
                    f"rows lost {c.missing}",
                    f"rows duplicated {c.duplicates}",
                    f"{c.rows:,} rows, {c.unexpected} unexpected"
                    + ("" if self.drained else ", NOT all checkpointed in time"),
                )
            )
        return rows

    def exactly_once(self) -> bool:
        return self.counted is not None and self.counted.exactly_once


class Rounds:
    """The faults of one setting against its running cluster."""

    def __init__(
        self,
        step: StepCluster,
        view: ShardView,
        ops: Coordinator,
        setting: Setting,
        *,
        warm_standby: bool,
    ) -> None:
        self.step, self.view, self.ops, self.setting = step, view, ops, setting
        self.warm_standby = warm_standby
        self.fresh = set(NODES)  # nodes that have not led since their process started

    def node(self, name: str) -> DaemonNode:
        return self.step.cluster.nodes[name]

    def restart(self, name: str, why: str) -> None:
        self.setting.restarts[why] += 1
        print(f"... restarting {name}: {why}", file=sys.stderr, flush=True)
        node = self.node(name)
        node.stop(30)
        node.start()
        node.wait_up(90)
        self.fresh.add(name)

    def settled(self) -> str:
        """Wait until a leader consumes and both nodes stand in the election; the leader."""

        def both() -> bool:
            return self.view.consuming_leader() is not None and self.view.candidates() >= set(NODES)

        wait(both, READY_TIMEOUT_S, "a consuming leader with both nodes standing", 0.1)
        leader = self.view.consuming_leader()
        assert leader is not None
        self.fresh.discard(leader)
        return leader

    def prepare(self) -> tuple[str, str]:
        """Both daemons up and standing, one leading; with on_followers off, a standby that
        has led since it started (so has Spark up) is restarted first, unless warm_standby."""
        for name in NODES:
            node = self.node(name)
            if not node.alive():
                code = node.process.exited_with() if node.process is not None else None
                print(f"... {name} exited by itself (code {code})", file=sys.stderr)
                self.restart(name, "after exiting by itself")
        leader = self.settled()
        standby = next(n for n in NODES if n != leader)
        if not self.setting.on_followers and not self.warm_standby and standby not in self.fresh:
            self.restart(standby, "to stand without Spark")
            leader = self.settled()
        if self.setting.on_followers:
            # The deployment measured: a warm standby (a restarted one warms in ~10 s).
            self.wait_warm(standby)
        return leader, standby

    def wait_warm(self, name: str) -> None:
        wait(self.node(name).flush_path_warm, READY_TIMEOUT_S, f"{name}'s flush path warm", 0.5)

    def memory(self) -> dict[str, TreeMemory]:
        """The leader's and the standby's process trees once settled: the standby warm, or
        with on_followers off freshly started (a daemon without Spark)."""
        leader, standby = self.prepare()
        time.sleep(MEMORY_SETTLE_S)
        standby_role = "standby, warm" if self.setting.on_followers else "standby, no Spark"
        found = {}
        for role, name in (("leader", leader), (standby_role, standby)):
            pid = self.node(name).pid
            assert pid is not None
            found[role] = tree_memory(pid)
        return found

    def start_together(self) -> tuple[float, float, float]:
        """Stop both daemons, then start both at once (a whole host starting): seconds from
        the start to a leader elected, consuming, and its first checkpoint."""
        for name in NODES:
            self.node(name).stop(30)
        fired = time.time()
        for name in NODES:
            self.node(name).start()
        result = self.measure("", fired, lambda: None)
        for name in NODES:
            self.node(name).wait_up(90)
        self.fresh = set(NODES)
        print(
            f"... on_followers={str(self.setting.on_followers).lower()} both started: elected "
            f"{ms(result[0])}, consuming {ms(result[1])}, checkpoint {ms(result[2])}",
            file=sys.stderr,
            flush=True,
        )
        return result

    def first_leader(self) -> None:
        """Wait until the first leader has committed a checkpoint: its Spark is up."""
        self.settled()
        wait(lambda: self.view.checkpoint_stat() is not None, 240, "the first checkpoint", 0.2)

    def round(self, kind: str) -> Takeover:
        victim, successor = self.prepare()
        cold = not self.node(successor).flush_path_warm()
        pending = self.view.wait_pending(PENDING_WAIT_S)
        node = self.node(victim)
        thaw_at: float | None = None
        fired = time.time()
        if kind == "ops":
            self.ops.request_failover(SHARD, to=successor, by="bench", timeout_s=60.0)
        elif kind == "kill":
            node.kill(signal.SIGKILL)
        else:
            node.kill(signal.SIGSTOP)
            thaw_at = fired + FROZEN_S
        try:
            left = kind != "ops" and self.view.pending()

            def thaw_when_due() -> None:
                nonlocal thaw_at
                if thaw_at is not None and time.time() >= thaw_at:
                    node.kill(signal.SIGCONT)
                    thaw_at = None

            elected, consuming, checkpoint = self.measure(victim, fired, thaw_when_due)
            while thaw_at is not None:
                thaw_when_due()
                time.sleep(POLL_S)
        finally:
            if thaw_at is not None:
                node.kill(signal.SIGCONT)
        self.fresh.discard(successor)
        if kind == "kill":
            node.start()
            node.wait_up(90)
            self.fresh.add(victim)
        result = Takeover(
            kind, victim, successor, pending, left, cold, elected, consuming, checkpoint
        )
        print(
            f"... on_followers={str(self.setting.on_followers).lower()} {FAULTS[kind]} "
            f"{victim} -> {successor}: elected {ms(elected)}, consuming {ms(consuming)}, "
            f"checkpoint {ms(checkpoint)} (intent at fault: {pending}, left: {left}, "
            f"without Spark: {cold})",
            file=sys.stderr,
            flush=True,
        )
        return result

    def measure(
        self, victim: str, fired: float, tick: Callable[[], None]
    ) -> tuple[float, float, float]:
        """Seconds from `fired` (Unix time) until another node's leader znode was created, said
        `consuming`, and the checkpoint was first modified after that creation (znode stamps:
        the server's clock). `tick` runs every poll (it continues a frozen leader when due)."""
        deadline = time.monotonic() + ROUND_TIMEOUT_S
        term: int | None = None  # czxid of the new leader's znode
        elected: float | None = None
        consuming: float | None = None
        checkpoint: float | None = None
        while consuming is None or checkpoint is None:
            tick()
            got = self.view.leader()
            if got is not None and got[0].node != victim:
                info, stat = got
                if stat.czxid != term:  # a new term (the first one seen, or a later one)
                    term, elected = stat.czxid, stat.ctime / 1000 - fired
                    consuming = checkpoint = None
                if consuming is None and info.status == "consuming":
                    consuming = stat.mtime / 1000 - fired
            if term is not None and checkpoint is None:
                cp = self.view.checkpoint_stat()
                if cp is not None and cp.mzxid > term:
                    checkpoint = cp.mtime / 1000 - fired
            if time.monotonic() > deadline:
                raise SystemExit(
                    f"no takeover of {victim}'s shard within {ROUND_TIMEOUT_S:.0f} s: elected "
                    f"{elected}, consuming {consuming}, checkpoint {checkpoint}"
                )
            time.sleep(POLL_S)
        assert elected is not None and consuming is not None and checkpoint is not None
        return elected, consuming, checkpoint


def drained(view: ShardView, topic: str, ends: dict[int, int]) -> bool:
    """Wait until the checkpoint covers every produced message; False if not in time."""
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    while time.monotonic() < deadline:
        done = view.checkpoint().get(topic, {})
        if all(done.get(p, 0) >= end for p, end in ends.items()):
            return True
        time.sleep(0.5)
    return False


def flush_times(step: StepCluster) -> tuple[list[float], int]:
    """Seconds of every steady flush (intent -> checkpoint) of both nodes: all but the first
    of each term, which re-flushes a pending block or waits for a Spark session; and how many
    pending blocks a new leader re-flushed."""
    seconds: list[float] = []
    reflushed = 0
    for node in step.cluster.nodes.values():
        first = True
        names = ["leader.elected", "flush.committed", "pending.reflush"]
        for event in log_events(node.log_path, names):
            if event["event"] == "leader.elected":
                first = True
            elif event["event"] == "pending.reflush":
                reflushed += 1
            elif first:
                first = False
            else:
                seconds.append(float(event["seconds"]))
    return seconds, reflushed


def run_setting(
    bench: Bench,
    on_followers: bool,
    faults: list[str],
    rounds: int,
    rate: int,
    *,
    warm_standby: bool,
) -> Setting:
    setting = Setting(on_followers)
    spec = Step(
        f"takeover_{'on' if on_followers else 'off'}",
        buffer=BUFFER,
        nodes={name: [SHARD] for name in NODES},
        spark_on_followers=on_followers,
        leaders=False,
    )
    print(f"... on_followers={str(on_followers).lower()}", file=sys.stderr, flush=True)
    with running(bench, spec) as step, contextlib.ExitStack() as stack:
        zk = ZkConfig(hosts=bench.stack.zookeeper, root=f"{ZK_ROOT}/{step.database}")
        ops = stack.enter_context(
            contextlib.closing(Coordinator(zk, "bench-ops", NodeInfo("", "", "", 0, "bench")))
        )
        ops.start()  # creates the root, which the view's session uses as its chroot
        view = stack.enter_context(contextlib.closing(ShardView(zk.hosts, zk.root)))
        production = stack.enter_context(producing(bench.stack.kafka, step.topic, rate))
        driver = Rounds(step, view, ops, setting, warm_standby=warm_standby)
        driver.first_leader()
        setting.baseline = watch_baseline(bench.stack.zookeeper)
        for kind in faults:
            for _ in range(rounds):
                setting.takeovers.append(driver.round(kind))
        setting.memory = driver.memory()
        for _ in range(STARTS):
            setting.starts.append(driver.start_together())
        production.stop()
        setting.produced = production.sent.value
        setting.undelivered = production.undelivered.value
        setting.rate = production.rate()
        ends = production.offsets()
        setting.drained = drained(view, step.topic, ends)
        setting.flushes, setting.reflushes = flush_times(step)
    expected = {(p, o) for p, end in ends.items() for o in range(end)}
    client = bench.ch.client(database=step.database)
    try:
        setting.counted = tally(client, "events", expected)
    finally:
        client.close()
    return setting


def report(settings: list[Setting], faults: list[str], rounds: int, rate: int) -> None:
    print(
        f"takeover bench: shard {SHARD} of {SHARDS} ({len(OWNED)} of {PARTITIONS} partitions) "
        f"served by {' and '.join(NODES)}, a producer at {rate:,} msg/s of ~{len(message(0))} B, "
        f"blocks sealed at >= {BUFFER['min_rows']:,} rows and >= {BUFFER['min_age']} s, "
        f"session timeout {ms(SESSION_TIMEOUT)}, {rounds} round{'s' * (rounds != 1)} per fault "
        f"fired while a flush intent exists, {os.cpu_count()} cores"
    )
    rows = [row for s in settings for row in s.rows(faults)]
    widths = [max((len(r[i]) for r in rows), default=0) for i in range(4)]
    for r in rows:
        print("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(r)).rstrip())
    print(
        "times: from the fault to the znode stamps (ZooKeeper's clock); first checkpoint: the "
        "new term's first write of the checkpoint znode"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="rounds per fault kind")
    parser.add_argument("--faults", default=",".join(FAULTS), help="of: ops,kill,stop")
    parser.add_argument("--on-followers", default="true,false", help="spark.on_followers values")
    parser.add_argument("--rate", type=int, default=RATE, help="messages/s produced")
    parser.add_argument(
        "--warm-standby",
        action="store_true",
        help="with on_followers false, keep a standby that has led before (Spark up) as it is",
    )
    args = parser.parse_args()
    faults = args.faults.split(",")
    if unknown := [f for f in faults if f not in FAULTS]:
        parser.error(f"unknown fault(s) {unknown}; known: {', '.join(FAULTS)}")
    values = {"false": False, "true": True}
    if unknown := [v for v in args.on_followers.split(",") if v not in values]:
        parser.error(f"--on-followers takes false and/or true, not {unknown}")
    configure_logs("console", "warning")  # the table, not the ops client's connection events
    settings: list[Setting] = []
    try:
        with local_stack("hakafka-takeover-bench-") as bench:
            for value in args.on_followers.split(","):
                settings.append(
                    run_setting(
                        bench,
                        values[value],
                        faults,
                        args.rounds,
                        args.rate,
                        warm_standby=args.warm_standby,
                    )
                )
    finally:
        report(settings, faults, args.rounds, args.rate)
    return 0 if settings and all(s.exactly_once() for s in settings) else 1


if __name__ == "__main__":
    sys.exit(main())
