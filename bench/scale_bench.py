"""At fleet scale: N `hakafka run` daemons (default 30) serving S shards (default 100), two
replicas each, one pipeline per shard, on the dev stack's 3-member ZooKeeper ensemble, all
flushing through one shared Spark Connect server (a fleet shares Spark: 30 driver JVMs do
not fit a 2-core machine), with a producer writing RATE events a second spread over all
shards (one partition per shard) for the whole run, and leadership balance on (the
defaults: a look every 10 s, a node handed nothing before it is up 30 s).

Shard s is served by nodes s mod N and s+1 mod N (a ring: every node serves 6 or 7 of 100
shards and shares them with its two neighbours), so a node's share is half its shards,
rounded up. One run measures, in order:

- cold start: every daemon started at once; from the start to every shard `consuming` and
  to every shard's first checkpoint; then until leadership is balanced (no node leads more
  than its share) and how many hand-overs that took, with the longest consuming gap of one;
- steady state (STEADY s): ZooKeeper requests/s and write transactions/s (summed `mntr`
  packets received; the zxid's counter, one per committed transaction, a multi-op counting
  once), per shard, and write transactions per flush against DESIGN's two (the intent and
  the checkpoint multi-ops); znodes and watches; per daemon threads, RSS and CPU, per shard
  led;
- kill -9 of the daemon leading the most shards (k), and of one leading the fewest (one, or
  as few as any leads): fault -> every one of its shards consuming on the other replica and
  -> its first checkpoint there, against the session timeout + 2 s;
- a rolling restart of every daemon, one at a time (SIGTERM; wait until its shards are led
  again; start it; wait until it is up): per step the longest gap of one of its shards in
  consuming (SIGTERM -> the next leader consuming) and in checkpoints (the last checkpoint
  before -> the first after), and the total; then until leadership is balanced again;
- idle (IDLE s, the producer stopped and everything flushed): the same ZooKeeper and
  per-daemon figures;
- exactly once over the whole run: every produced (partition, offset) in ClickHouse once.

The raw baselines beside the figures, from the same run: the session timeout (the floor of
any takeover after a kill), and one kill -9 of a daemon that leads a single shard (or the
fewest) as the per-shard takeover to compare the k-shard one with. Times are ZooKeeper's own
znode ctime/mtime (this machine's clock), read by a poller every POLL_S, so polling does not
blur them. Rows lost or duplicated make the exit code 1.

Run: PYTHONPATH=. .venv/bin/python bench/scale_bench.py [--daemons 30] [--shards 100]
     [--rate 500] [--steady 60] [--idle 30]   (about 20 minutes at the defaults)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import statistics
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kazoo.client import KazooClient

from devstack.chaos.checks import event_time, log_events
from devstack.clickhouse import ClickHouseService
from devstack.cluster import DaemonNode, LocalCluster, PipelineSpec, StackEndpoints
from devstack.kafka import KafkaBroker
from devstack.process import wait_until
from devstack.records import EVENT_COLUMNS, Load, create_topic, tally
from devstack.spark_cluster import SparkConnectServer
from devstack.zookeeper import ZooKeeperEnsemble, four_letter_word

SESSION_TIMEOUT = 6.0  # the daemon's default
ZK_ROOT = "/scale"
DATABASE = "scale"
POLL_S = 0.5
# A block a minute per shard (S / 60 flushes a second through the one Spark Connect server
# and ClickHouse front): at 15 s, 100 shards' flushes queued for minutes on 2 cores.
BUFFER: dict[str, int | float] = {
    "min_rows": 5_000,
    "max_rows": 100_000,
    "min_bytes": 1,
    "min_age": 5,
    "max_age": 60,
}
BALANCE_TIMEOUT_S = 600.0
CLK_TCK = os.sysconf("SC_CLK_TCK")


def ring(daemons: int, shards: int) -> dict[str, list[int]]:
    """node -> its shards: shard s on nodes s mod N and s+1 mod N."""
    names = [f"n{i:02d}" for i in range(daemons)]
    return {
        name: [s for s in range(shards) if i in (s % daemons, (s + 1) % daemons)]
        for i, name in enumerate(names)
    }


def share(served: int) -> int:
    """A node's share of leadership: half the shards it serves (two replicas each), rounded up."""
    return math.ceil(served / 2)


@dataclass(frozen=True)
class LeaderSeen:
    """One shard's `leader` znode as read: its node, status and ZooKeeper times (Unix s)."""

    node: str
    status: str
    ctime: float
    mtime: float


@dataclass
class History:
    """What the poller saw: per shard, every distinct `leader` znode and checkpoint mtime."""

    leaders: dict[int, list[LeaderSeen]] = field(default_factory=dict)
    checkpoints: dict[int, list[float]] = field(default_factory=dict)

    def consuming_after(
        self, shard: int, after: float, not_node: str | None = None
    ) -> float | None:
        """When a leader elected after `after` (not `not_node`) first said `consuming`."""
        for seen in self.leaders.get(shard, []):
            if seen.ctime > after and seen.status == "consuming" and seen.node != not_node:
                return seen.mtime
        return None

    def checkpoint_after(self, shard: int, after: float) -> float | None:
        return next((t for t in self.checkpoints.get(shard, []) if t > after), None)

    def checkpoint_before(self, shard: int, before: float) -> float | None:
        return max((t for t in self.checkpoints.get(shard, []) if t <= before), default=None)


class Poller:
    """Reads every shard's `leader` and checkpoint stat every POLL_S on its own thread into a
    `History`; `paused()` stops it for a measurement window (its reads would count)."""

    def __init__(self, hosts: str, shards: int) -> None:
        self.zk = KazooClient(hosts=f"{hosts}{ZK_ROOT}", timeout=15.0)
        self.zk.start(timeout=30)
        self.shards = shards
        self.history = History()
        self._run = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="scale-poller", daemon=True)

    def start(self) -> None:
        self._run.set()
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._run.set()
        self._thread.join(timeout=60)
        self.zk.stop()
        self.zk.close()

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        self._run.clear()
        with self._lock:  # the poll in progress ends first
            pass
        try:
            yield
        finally:
            self._run.set()

    def leaders(self) -> dict[int, LeaderSeen]:
        """Every shard's leader now."""
        found = {}
        for shard in range(self.shards):
            try:
                data, stat = self.zk.get(f"/shards/{shard}/leader")
            except Exception:
                continue
            value = json.loads(data)
            found[shard] = LeaderSeen(
                value["node"], value.get("status", ""), stat.ctime / 1000, stat.mtime / 1000
            )
        return found

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._run.wait()
            if self._stop.is_set():
                return
            with self._lock:
                self._poll_once()
            self._stop.wait(POLL_S)

    def _poll_once(self) -> None:
        for shard, seen in self.leaders().items():
            seen_before = self.history.leaders.setdefault(shard, [])
            if not seen_before or seen_before[-1] != seen:
                seen_before.append(seen)
        for shard in range(self.shards):
            stat = self.zk.exists(f"/shards/{shard}/pipelines/events/checkpoint")
            if stat is not None:
                times = self.history.checkpoints.setdefault(shard, [])
                mtime = stat.mtime / 1000
                if not times or times[-1] != mtime:
                    times.append(mtime)


@dataclass(frozen=True)
class ProcessSample:
    cpu_s: float
    rss_mib: float
    threads: int


def process_sample(pid: int) -> ProcessSample:
    """The CPU seconds, RSS and threads of process `pid` (not its children: a Spark Connect
    client starts none)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / CLK_TCK
    status = Path(f"/proc/{pid}/status").read_text()
    rss = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS"))
    threads = next(
        int(line.split()[1]) for line in status.splitlines() if line.startswith("Threads")
    )
    return ProcessSample(cpu, rss / 1024, threads)


@dataclass(frozen=True)
class ZkSample:
    """Summed over the ensemble's members: packets received; the highest zxid's counter;
    znodes (the leader's count) and watches (each member counts its own clients')."""

    at: float
    received: int
    zxid: int
    znodes: int
    watches: int


def zk_sample(ensemble: ZooKeeperEnsemble) -> ZkSample:
    received = zxid = znodes = watches = 0
    for member in ensemble.members:
        mntr = dict(
            line.split("\t", 1)
            for line in four_letter_word(member.client_port, "mntr", timeout=5.0).splitlines()
            if "\t" in line
        )
        received += int(mntr["zk_packets_received"])
        watches += int(mntr["zk_watch_count"])
        znodes = max(znodes, int(mntr["zk_znode_count"]))
        srvr = four_letter_word(member.client_port, "srvr", timeout=5.0)
        line = next(x for x in srvr.splitlines() if x.startswith("Zxid:"))
        zxid = max(zxid, int(line.split(":", 1)[1].strip(), 16) & 0xFFFFFFFF)
    return ZkSample(time.monotonic(), received, zxid, znodes, watches)


def metric_sum(node: DaemonNode, name: str, having: str = "") -> float:
    """The sum of `name`'s samples on `node` whose labels contain `having`."""
    code, body = node.get("/metrics", timeout=10.0)
    if code != 200:
        return 0.0
    total = 0.0
    for line in body.decode().splitlines():
        if line.startswith((name + "{", name + " ")) and having in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


@dataclass
class Fleet:
    """The running cluster and what the bench reads it with."""

    cluster: LocalCluster
    layout: dict[str, list[int]]
    ensemble: ZooKeeperEnsemble
    poller: Poller
    shards: int

    def live(self) -> dict[str, DaemonNode]:
        return {name: n for name, n in self.cluster.nodes.items() if n.alive()}

    def led(self) -> Counter[str]:
        return Counter(seen.node for seen in self.poller.leaders().values())

    def balanced(self) -> bool:
        """No live node leads more than its share of the shards it serves."""
        led = self.led()
        return all(led.get(name, 0) <= share(len(self.layout[name])) for name in self.live())

    def flushes(self) -> float:
        return sum(
            metric_sum(n, "hakafka_flushes_total", 'result="ok"') for n in self.live().values()
        )


def wait(check: Callable[[], bool], timeout: float, what: str) -> None:
    wait_until(check, timeout=timeout, what=what, interval=POLL_S)


def seconds(values: Sequence[float]) -> str:
    if not values:
        return "-"
    return f"median {statistics.median(values):.1f} s, max {max(values):.1f} s (n={len(values)})"


def cold_start(fleet: Fleet) -> None:
    began = time.time()
    fleet.cluster.start(timeout=600)
    up = time.time() - began
    startup_cpu = [process_sample(n.pid).cpu_s for n in fleet.live().values() if n.pid]
    everyone = range(fleet.shards)
    wait(
        lambda: all(fleet.poller.history.consuming_after(s, began) for s in everyone),
        600,
        "every shard consuming",
    )
    consuming = max(fleet.poller.history.consuming_after(s, began) or 0 for s in everyone)
    wait(
        lambda: all(fleet.poller.history.checkpoint_after(s, began) for s in everyone),
        600,
        "every shard's first checkpoint",
    )
    checkpoint = max(fleet.poller.history.checkpoint_after(s, began) or 0 for s in everyone)
    print(f"cold start: {len(fleet.layout)} daemons, {fleet.shards} shards")
    print(
        f"  start -> every daemon up              {up:6.1f} s   (CPU per daemon by then: "
        f"median {statistics.median(startup_cpu):.1f} s: {len(startup_cpu)} daemons on "
        f"{os.cpu_count()} cores need {sum(startup_cpu) / (os.cpu_count() or 1):.0f} s of the "
        "machine)"
    )
    print(f"  start -> every shard consuming       {consuming - began:6.1f} s   (target <= 30 s)")
    print(f"  start -> every shard's 1st checkpoint {checkpoint - began:6.1f} s")
    balance(fleet, began, "after the cold start")


def balance(fleet: Fleet, began: float, when: str) -> None:
    """Wait until leadership is balanced; print how long from `began`, the moves it took and
    what one cost."""
    led = fleet.led()
    worst = max(led.get(n, 0) - share(len(fleet.layout[n])) for n in fleet.live())
    deadline = time.monotonic() + BALANCE_TIMEOUT_S
    while not fleet.balanced() and time.monotonic() < deadline:
        time.sleep(POLL_S)
    took = time.time() - began
    if not fleet.balanced():
        led = fleet.led()
        over = {
            n: led[n] - share(len(fleet.layout[n]))
            for n in fleet.live()
            if led.get(n, 0) > share(len(fleet.layout[n]))
        }
        print(f"  NOT balanced {when} after {took:.0f} s: over their share: {over}")
    nodes = fleet.live()
    logs = [n.log_path for n in nodes.values()]
    moves = [e for e in log_events(logs, ["balance.move"]) if event_time(e["timestamp"]) > began]
    gaps = []
    for move in moves:
        at = event_time(move["timestamp"])
        done = fleet.poller.history.consuming_after(int(move["shard"]), at, not_node=None)
        if done is not None:
            gaps.append(done - at)
    led = fleet.led()
    print(
        f"  balanced {when}: {took:6.1f} s after it began, {len(moves)} hand-overs "
        f"(most over its share before: +{worst}); leads per node now "
        f"{min(led.get(n, 0) for n in nodes)}..{max(led.values())}; "
        f"a move's consuming gap: {seconds(gaps)}"
    )


def steady(fleet: Fleet, window: float, label: str) -> None:
    """ZooKeeper and per-daemon figures over `window` seconds, the poller paused."""
    nodes = fleet.live()
    with fleet.poller.paused():
        pids = {name: n.pid for name, n in nodes.items() if n.pid is not None}
        zk0, flushes0 = zk_sample(fleet.ensemble), fleet.flushes()
        before = {name: process_sample(pid) for name, pid in pids.items()}
        time.sleep(window)
        after = {name: process_sample(pid) for name, pid in pids.items()}
        zk1, flushes1 = zk_sample(fleet.ensemble), fleet.flushes()
        led = fleet.led()
    span = zk1.at - zk0.at
    requests = (zk1.received - zk0.received) / span
    writes = (zk1.zxid - zk0.zxid) / span
    flushes = flushes1 - flushes0
    shards = fleet.shards
    print(f"{label} ({span:.0f} s, poller paused):")
    print(
        f"  ZooKeeper: {requests:7.1f} requests/s ({requests / shards:.2f} per shard), "
        f"{writes:6.1f} write txns/s ({writes / shards:.3f} per shard); "
        f"{zk1.znodes} znodes, {zk1.watches} watches"
    )
    if flushes:
        print(
            f"  flushes: {flushes:.0f} ({flushes / span:.2f}/s): "
            f"{(zk1.zxid - zk0.zxid) / flushes:.2f} write txns per flush (DESIGN: 2)"
        )
    cpu = [(after[n].cpu_s - before[n].cpu_s) / span * 100 for n in pids]
    rss = [after[n].rss_mib for n in pids]
    threads = [after[n].threads for n in pids]
    per_led = [
        ((after[n].cpu_s - before[n].cpu_s) / span * 100, after[n].threads, led.get(n, 0))
        for n in pids
    ]
    leading = [x for x in per_led if x[2]]
    print(
        f"  per daemon: CPU {statistics.mean(cpu):.1f} % (max {max(cpu):.1f}), "
        f"RSS {statistics.mean(rss):.0f} MiB (max {max(rss):.0f}), "
        f"threads {statistics.mean(threads):.0f} (max {max(threads)}); "
        f"all {len(pids)} daemons: CPU {sum(cpu):.0f} % of one core"
    )
    counts = {x[2] for x in per_led}
    if leading and len(counts) > 1:
        slope = _slope([x[2] for x in per_led], [x[1] for x in per_led])
        cpu_slope = _slope([x[2] for x in per_led], [x[0] for x in per_led])
        print(
            f"  per shard led: +{slope:.1f} threads, +{cpu_slope:.2f} % CPU "
            f"(least squares over the daemons; leads {min(counts)}..{max(counts)})"
        )
    elif leading:
        print(f"  every daemon leads {counts.pop()} shards (no spread to fit a per-shard cost)")


def _slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    mx, my = statistics.mean(xs), statistics.mean(ys)
    var = sum((x - mx) ** 2 for x in xs)
    return 0.0 if var == 0 else sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var


def kill(fleet: Fleet, name: str) -> tuple[int, float, float]:
    """kill -9 `name`: (shards it led, fault -> all consuming elsewhere, -> all checkpointed);
    the node is started again afterwards."""
    led = [s for s, seen in fleet.poller.leaders().items() if seen.node == name]
    node = fleet.cluster.nodes[name]
    at = time.time()
    node.kill(signal.SIGKILL)
    history = fleet.poller.history
    wait(
        lambda: all(history.consuming_after(s, at, not_node=name) for s in led),
        120,
        f"{name}'s {len(led)} shards consuming elsewhere",
    )
    wait(
        lambda: all(history.checkpoint_after(s, at) for s in led),
        180,
        f"{name}'s {len(led)} shards checkpointed",
    )
    consuming = max(history.consuming_after(s, at, not_node=name) or 0 for s in led) - at
    checkpoint = max(history.checkpoint_after(s, at) or 0 for s in led) - at
    node.start()
    node.wait_up(120)
    return len(led), consuming, checkpoint


def kills(fleet: Fleet) -> None:
    led = fleet.led()
    most = led.most_common(1)[0][0]
    k, consuming, checkpoint = kill(fleet, most)
    led = fleet.led()
    fewest = min((n for n in fleet.live() if led.get(n, 0) > 0), key=lambda n: led[n])
    one, one_consuming, one_checkpoint = kill(fleet, fewest)
    bound = SESSION_TIMEOUT + 2.0
    print(f"kill -9 (session timeout {SESSION_TIMEOUT:g} s):")
    print(
        f"  {most} leading {k} shards: -> all consuming {consuming:5.1f} s (target <= {bound:g} s, "
        f"<= 1.5 x the {one}-shard figure), -> all checkpointed {checkpoint:5.1f} s"
    )
    print(
        f"  baseline: {fewest} leading {one}: -> consuming {one_consuming:5.1f} s, "
        f"-> checkpointed {one_checkpoint:5.1f} s; ratio {consuming / one_consuming:.2f}"
    )


def _led_again(
    history: History, led: Sequence[int], stopped: float, name: str
) -> Callable[[], bool]:
    return lambda: all(history.consuming_after(s, stopped, not_node=name) for s in led)


def rolling(fleet: Fleet) -> None:
    history = fleet.poller.history
    began = time.time()
    steps = []
    for name, node in fleet.cluster.nodes.items():
        led = [s for s, seen in fleet.poller.leaders().items() if seen.node == name]
        last = {s: history.checkpoint_before(s, time.time()) for s in led}
        stopped = time.time()
        node.stop()
        wait(_led_again(history, led, stopped, name), 120, f"{name}'s shards led again")
        node.start()
        node.wait_up(120)
        steps.append((name, led, stopped, last))
    total = time.time() - began
    wait(
        lambda: all(
            history.checkpoint_after(s, stopped) for _, led, stopped, _ in steps for s in led
        ),
        180,
        "every shard moved by the roll checkpointed",
    )
    consuming, checkpoints = [], []
    for _name, led, stopped, last in steps:
        gaps = [(history.consuming_after(s, stopped) or stopped) - stopped for s in led]
        cps = [
            (history.checkpoint_after(s, stopped) or stopped) - (last[s] or stopped) for s in led
        ]
        if led:
            consuming.append(max(gaps))
            checkpoints.append(max(cps))
    print(f"rolling restart of {len(steps)} daemons: {total:.0f} s in all")
    print(f"  per step, longest gap in consuming:   {seconds(consuming)}")
    print(f"  per step, longest gap in checkpoints: {seconds(checkpoints)}")
    balance(fleet, began + total, "after the last restarted node returned")


@contextlib.contextmanager
def fleet_stack(
    root: Path,
) -> Iterator[tuple[ZooKeeperEnsemble, StackEndpoints, ClickHouseService, str]]:
    zk = ZooKeeperEnsemble(root / "zk", members=3)
    broker, ch = KafkaBroker(root / "kafka"), ClickHouseService(root / "ch")
    connect = SparkConnectServer(root / "spark-connect", driver_memory="2g")
    started: list[ZooKeeperEnsemble | KafkaBroker | ClickHouseService | SparkConnectServer] = []
    try:
        for service in (zk, broker, ch, connect):
            service.start()
            started.append(service)
        stack = StackEndpoints(zk.hosts, broker.bootstrap, f"127.0.0.1:{ch.port}")
        yield zk, stack, ch, connect.url
    finally:
        for service in reversed(started):
            service.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--daemons", type=int, default=30)
    parser.add_argument("--shards", type=int, default=100)
    parser.add_argument("--rate", type=int, default=500, help="events a second, in all")
    parser.add_argument("--steady", type=float, default=60.0)
    parser.add_argument("--idle", type=float, default=30.0)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="hakafka-scale-"))
    layout = ring(args.daemons, args.shards)
    with fleet_stack(root) as (ensemble, stack, ch, connect_url):
        topic = "scale_events"
        create_topic(stack.kafka, topic, args.shards)
        cluster = LocalCluster(
            root / "cluster",
            stack,
            nodes=layout,
            shard_count=args.shards,
            pipelines=[PipelineSpec("events", topic, "events", EVENT_COLUMNS, BUFFER)],
            zk_root=ZK_ROOT,
            database=DATABASE,
            session_timeout=SESSION_TIMEOUT,
            spark={"remote": connect_url},
            balance={"enabled": True},
        )
        ch.client().command(f"CREATE DATABASE IF NOT EXISTS {DATABASE}")
        poller = Poller(stack.zookeeper, args.shards)
        load = Load(stack.kafka, topic, args.shards, chunk=max(1, args.rate // 5), pause=0.2)
        fleet = Fleet(cluster, layout, ensemble, poller, args.shards)
        try:
            poller.start()
            load.start()
            try:
                cold_start(fleet)
                steady(fleet, args.steady, f"steady state at {args.rate} events/s")
                kills(fleet)
                rolling(fleet)
            finally:
                load.stop()
            client = ch.client(database=DATABASE)
            produced = load.produced.good
            wait(lambda: tally(client, "events", produced).missing == 0, 600, "every row landed")
            steady(fleet, args.idle, "idle, the producer stopped")
            result = tally(client, "events", produced)
            print(f"exactly once: {len(produced):,} produced; {result}")
        finally:
            poller.close()
            cluster.kill()  # by PID, also when a step failed
    return 0 if result.exactly_once else 1


if __name__ == "__main__":
    raise SystemExit(main())
