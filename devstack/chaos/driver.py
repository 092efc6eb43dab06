"""The chaos driver: a seeded schedule of bounded faults on a local hakafka cluster.

`ChaosDriver.run` applies faults picked by `random.Random(seed)`: SIGKILL or SIGSTOP a shard
leader (also together with its own ClickHouse replica), SIGKILL and restart a ZooKeeper
member, restart the broker, stop the ClickHouse front for a while, mark and clear a node's
replacement, ask for failovers, lose a ZooKeeper reply or freeze the server for one node,
kill an operator command half-way and, where a daemon runs in a `NetworkNamespace` of its
own, cut its veth link. Every fault ends by itself (a stopped process is continued, a stopped
service started again) and `heal` brings back anything still down. With a `ReshardPlan`, the
driver also reshards the running cluster between two faults (`hakafka reshard` with the new
layout, then every node restarted with its new config from `LocalCluster.layout_configs`)
and records the attempt. The seed comes from `CHAOS_SEED` when set, so a run can be replayed
(the schedule is the same; timing on a busy machine is not).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from devstack.chaos.checks import Commit, mark_start, read_commits
from devstack.chaos.netns import NetworkNamespace
from devstack.clickhouse import ClickHouseService
from devstack.cluster import DaemonNode, LocalCluster
from devstack.kafka import KafkaBroker
from devstack.process import DevstackError, run_hakafka, wait_until
from devstack.zk_proxy import Op, ZkProxy
from devstack.zookeeper import ZooKeeperEnsemble
from hakafka.config import load_config
from hakafka.coordination.coordinator import Coordinator
from hakafka.coordination.errors import FailoverRefused

SEED_ENV = "CHAOS_SEED"
KINDS = (
    "kill_leader",
    "stop_leader",
    "restart_zookeeper_member",
    "restart_broker",
    "clickhouse_outage",
    "replace_node",
    "failover",
    "ops_command_killed",
)
# Faults through each node's ZooKeeper proxy (`ChaosTargets.zk_proxies`).
PROXY_KINDS = ("zk_reply_lost", "zk_frozen")
# A session this long or longer outlives a frozen server's silence by seconds; the replies
# are then held for this share of it (kazoo drops a silent connection at 2/3).
LONG_SESSION_S = 10.0
FROZEN_SHARE = 0.4
# With a ClickHouse replica of each node's own (`LocalCluster(replica_per_node=True)`).
REPLICA_KINDS = ("kill_leader_with_replica",)
# How long a node's replica stays down at most, waiting for the next leader's checkpoint.
REPLICA_DOWN_S = 45.0


def chaos_seed() -> int:
    """The seed of this run: `CHAOS_SEED` if set (an integer), else a fresh random one."""
    raw = os.environ.get(SEED_ENV, "").strip()
    if not raw:
        return random.SystemRandom().randrange(2**32)
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{SEED_ENV}={raw!r}: the seed must be an integer") from None


@dataclass(frozen=True)
class Fault:
    """One fault of the schedule: when it began (seconds into the run), what, on whom, and
    how it went (`applied`, `refused: …`, `skipped: …` or `error: …`)."""

    at: float
    kind: str
    target: str
    outcome: str
    seconds: float


class _Skip(Exception):  # noqa: N818 (a fault that does not apply now, not an error)
    """The fault has nothing to act on right now (e.g. the shard has no leader)."""


@dataclass
class ChaosTargets:
    """What the driver may break. `broker_lock` is held while the broker restarts, so a
    producer holding it never sees the restart mid-batch. With `netns`, daemon `netns_node`
    runs inside that network namespace and the driver also partitions it for real."""

    cluster: LocalCluster
    zookeeper: ZooKeeperEnsemble
    broker: KafkaBroker
    clickhouse: ClickHouseService
    coordinator: Coordinator
    shards: list[int]
    broker_lock: threading.Lock = field(default_factory=threading.Lock)
    netns: NetworkNamespace | None = None
    netns_node: str | None = None
    zk_proxies: Mapping[str, ZkProxy] = field(default_factory=dict)
    """Each node's ZooKeeper proxy (node -> proxy), when the nodes connect through one."""
    request_timeout: float = 5.0
    """The nodes' `zookeeper.request_timeout`."""

    def start_node(self, name: str) -> None:
        """Start daemon `name` (inside the namespace if it is the namespaced one), first
        marking the restart in its log (`NODE_STARTING`) and starting its own ClickHouse
        replica if it has one that is down."""
        node = self.cluster.nodes[name]
        self.cluster.start_replica(name)
        mark_start(node.log_path, name)
        if self.netns is not None and name == self.netns_node:
            self.netns.start_daemon(node)
        else:
            node.start()

    def start_cluster(self, timeout: float = 120.0) -> None:
        for name in self.cluster.nodes:
            self.start_node(name)
        for node in self.cluster.nodes.values():
            node.wait_up(timeout)


@dataclass(frozen=True)
class Partition:
    """One real network partition of the namespaced node: the shards it led when cut off,
    whether another node led and consumed each of them before the link came back, and the
    checkpoints it committed while cut off (after the session timeout: must be none)."""

    node: str
    led: tuple[int, ...]
    cut_at: float
    healed_at: float
    taken_over: bool
    commits_while_cut: tuple[Commit, ...]


@dataclass(frozen=True)
class ReshardPlan:
    """A reshard in the fault schedule: once `after` faults were applied, move the running
    cluster to `layout` (node -> its shards) of `shard_count` shards; a failed attempt is
    tried once more `retry_after` faults later. `timeout` is `hakafka reshard --timeout`
    (the drain); `consuming_timeout` bounds the wait for the new layout's leaders."""

    after: int
    layout: Mapping[str, Sequence[int]]
    shard_count: int
    timeout: float = 90.0
    retry_after: int = 3
    consuming_timeout: float = 120.0


@dataclass(frozen=True)
class ReshardAttempt:
    """One `hakafka reshard` of the run: when it was requested (seconds into the run),
    whether the command moved the layout (`resharded`), the partitions it moved (its lines
    `<pipeline>: partition P at offset O: shard A -> shard B`), and `seconds` from the
    request until every shard of the new layout had a consuming leader (None: not within
    the plan's bound, or the command failed); `detail` says what went wrong."""

    at: float
    resharded: bool
    moves: tuple[str, ...]
    seconds: float | None
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.resharded and self.seconds is not None

    def describe(self) -> str:
        if not self.resharded:
            return f"t={self.at:.1f}s FAILED, the old layout consumes again: {self.detail}"
        took = (
            f"request -> every shard consuming {self.seconds:.1f} s"
            if self.seconds is not None
            else f"NOT every shard consuming: {self.detail}"
        )
        return f"t={self.at:.1f}s resharded, {took}; moved: {'; '.join(self.moves) or 'none'}"


class ChaosDriver:
    """Applies a seeded schedule of bounded faults to `targets`; `faults` is the record."""

    def __init__(
        self,
        targets: ChaosTargets,
        seed: int,
        *,
        session_timeout: float,
        say: Callable[[str], None] = print,
    ) -> None:
        self.targets = targets
        self.seed = seed
        self.session_timeout = session_timeout
        self.rng = random.Random(seed)
        self.say = say
        self.faults: list[Fault] = []
        self.unplanned_exits: list[str] = []
        self.partitions: list[Partition] = []
        self.reshards: list[ReshardAttempt] = []
        self.kinds = (
            KINDS
            + (("partition_node",) if targets.netns is not None else ())
            + (PROXY_KINDS if targets.zk_proxies else ())
            + (REPLICA_KINDS if targets.cluster.replica_per_node else ())
        )
        self.began = time.monotonic()
        """When the driver was made (time.monotonic()); each `Fault.at` counts from it."""
        self._deck: list[str] = []
        self._actions: dict[str, Callable[[], tuple[str, str]]] = {
            "kill_leader": self._kill_leader,
            "kill_leader_with_replica": self._kill_leader_with_replica,
            "stop_leader": self._stop_leader,
            "restart_zookeeper_member": self._restart_zookeeper_member,
            "restart_broker": self._restart_broker,
            "clickhouse_outage": self._clickhouse_outage,
            "replace_node": self._replace_node,
            "failover": self._failover,
            "partition_node": self._partition_node,
            "zk_reply_lost": self._zk_reply_lost,
            "zk_frozen": self._zk_frozen,
            "ops_command_killed": self._ops_command_killed,
        }

    def run(
        self,
        count: int,
        *,
        gap: tuple[float, float],
        deadline: float,
        reshard: ReshardPlan | None = None,
    ) -> list[Fault]:
        """Apply faults until `count` of them were applied (refused or skipped ones do not
        count; at most 2 x `count` tries), with a pause of `gap` seconds before each; stop
        early at `deadline` (time.monotonic()). With `reshard`, the cluster is resharded
        between two faults once `reshard.after` were applied (or when the schedule ends
        before), and a failed attempt once more `reshard.retry_after` faults later
        (`reshards` records them). Returns every fault tried by this call."""
        tried: list[Fault] = []
        applied = 0
        due = None if reshard is None else reshard.after
        while applied < count and len(tried) < 2 * count:
            if time.monotonic() >= deadline:
                self.say(f"chaos: deadline reached after {applied} applied faults")
                break
            if reshard is not None and due is not None and applied >= due:
                due = self._attempt_reshard(reshard, applied)
            time.sleep(self.rng.uniform(*gap))
            self._restart_unplanned_exits()
            fault = self.apply(self._next_kind())
            tried.append(fault)
            applied += fault.outcome.startswith("applied")
        if reshard is not None and due is not None:  # the schedule ended first
            self._attempt_reshard(reshard, applied)
        return tried

    def _attempt_reshard(self, plan: ReshardPlan, applied: int) -> int | None:
        """Reshard now; after how many applied faults to try again (None: not again)."""
        attempt = self.reshard(plan)
        again = not attempt.resharded and len(self.reshards) < 2
        return applied + plan.retry_after if again else None

    def _next_kind(self) -> str:
        """Kinds are dealt from a shuffled deck of all of them, so a short run still covers
        every kind and a long one covers them evenly."""
        if not self._deck:
            self._deck = list(self.kinds)
            self.rng.shuffle(self._deck)
        return self._deck.pop()

    def apply(self, kind: str) -> Fault:
        """Apply one fault of `kind` now and wait until it has ended."""
        start = time.monotonic()
        try:
            target, outcome = self._actions[kind]()
        except _Skip as why:
            target, outcome = "-", f"skipped: {why}"
        except Exception as exc:
            target, outcome = "?", f"error: {exc!r}"
        fault = Fault(
            round(start - self.began, 2), kind, target, outcome, round(time.monotonic() - start, 2)
        )
        self.faults.append(fault)
        self.say(
            f"chaos: #{len(self.faults)} t={fault.at:.1f}s {kind} {target}: {outcome} "
            f"({fault.seconds:.1f}s)"
        )
        return fault

    # -- helpers ----------------------------------------------------------------------------

    def _node(self, name: str) -> DaemonNode:
        return self.targets.cluster.nodes[name]

    def _leader(self) -> tuple[int, str, DaemonNode]:
        """A random shard, its leader's name (as ZooKeeper has it) and daemon; `_Skip` when
        the shard has no leader right now."""
        shard = self.rng.choice(self.targets.shards)
        info = self.targets.coordinator.leader_of(shard)
        if info is None or info.node not in self.targets.cluster.nodes:
            raise _Skip(f"shard {shard} has no leader right now")
        return shard, info.node, self._node(info.node)

    def _restart_unplanned_exits(self) -> None:
        """Start daemons that exited although no fault killed them (and record that)."""
        for name, node in self.targets.cluster.nodes.items():
            if node.process is not None and not node.alive():
                code = node.process.exited_with()
                self.unplanned_exits.append(f"{name} exited with {code}: {node.log_tail(5)}")
                self.say(f"chaos: {name} exited by itself (code {code}); starting it again")
                self.targets.start_node(name)

    # -- faults -----------------------------------------------------------------------------

    def _kill_leader(self) -> tuple[str, str]:
        shard, name, node = self._leader()
        node.kill(signal.SIGKILL)
        down = self.rng.uniform(1.0, 4.0)
        time.sleep(down)
        self.targets.start_node(name)
        return f"{name} (leader of shard {shard})", f"applied: SIGKILL, restarted {down:.1f}s later"

    def _kill_leader_with_replica(self) -> tuple[str, str]:
        """SIGKILL a shard's leader together with its own ClickHouse replica, as when the
        machine both run on dies. Both stay down until another node checkpointed the shard
        (at most `REPLICA_DOWN_S`), so the next term starts and flushes without that replica;
        the outcome says whether it did and how long it took."""
        cluster = self.targets.cluster
        shard, name, node = self._leader()
        others = {n: d.log_path for n, d in cluster.nodes.items() if n != name}
        killed_at = time.time()
        node.kill(signal.SIGKILL)
        cluster.kill_replica(name)

        def checkpointed() -> bool:
            return any(c.shard == shard and c.at > killed_at for c in read_commits(others))

        try:
            wait_until(checkpointed, timeout=REPLICA_DOWN_S, what="a checkpoint", interval=1.0)
            result = f"checkpointed by another node {time.time() - killed_at:.1f}s later"
        except DevstackError:
            result = f"NOT checkpointed within {REPLICA_DOWN_S:.0f}s"
        finally:
            cluster.start_replica(name)
            self.targets.start_node(name)
        return (
            f"{name} (leader of shard {shard}) with its ClickHouse replica",
            f"applied: SIGKILL; shard {shard} {result} while the replica was down",
        )

    def _stop_leader(self) -> tuple[str, str]:
        shard, name, node = self._leader()
        frozen = self.session_timeout + 2.0
        node.kill(signal.SIGSTOP)
        try:
            time.sleep(frozen)
        finally:
            node.kill(signal.SIGCONT)
        return f"{name} (leader of shard {shard})", f"applied: SIGSTOP for {frozen:.1f}s"

    def _restart_zookeeper_member(self) -> tuple[str, str]:
        zk = self.targets.zookeeper
        # Half of the time the quorum leader, so an election of the ensemble happens too.
        leader = zk.leader_id()
        myid = (
            leader
            if leader is not None and self.rng.random() < 0.5
            else self.rng.choice([m.myid for m in zk.members])
        )
        role = "leader" if myid == leader else "follower"
        zk.stop_member(myid, sig=signal.SIGKILL)
        down = self.rng.uniform(1.0, 3.0)
        time.sleep(down)
        zk.start_member(myid, timeout=30.0)
        return f"zookeeper member {myid} ({role})", f"applied: SIGKILL, back after {down:.1f}s"

    def _restart_broker(self) -> tuple[str, str]:
        with self.targets.broker_lock:
            self.targets.broker.restart(timeout=30.0)
        return "broker", "applied: restarted on s3 storage"

    def _clickhouse_outage(self) -> tuple[str, str]:
        ch = self.targets.clickhouse
        how = self.rng.choice(["SIGTERM", "SIGKILL"])
        if how == "SIGKILL":
            ch.kill()
        else:
            ch.stop()
        down = self.rng.uniform(5.0, 8.0)
        time.sleep(down)
        ch.start(timeout=30.0)
        return "clickhouse front", f"applied: {how}, down {down:.1f}s"

    def _replace_node(self) -> tuple[str, str]:
        name = self.rng.choice(sorted(self.targets.cluster.nodes))
        coordinator = self.targets.coordinator
        coordinator.mark_replacing(name, reason="chaos", by="chaos")
        held = self.rng.uniform(3.0, 5.0)
        try:
            time.sleep(held)
        finally:
            coordinator.clear_replacing(name)
        return name, f"applied: under replacement for {held:.1f}s"

    def _failover(self) -> tuple[str, str]:
        shard = self.rng.choice(self.targets.shards)
        candidates = sorted(
            name
            for name, node in self.targets.cluster.nodes.items()
            if shard in node.configured_shards()
        )
        to = self.rng.choice([None, *candidates])
        target = f"shard {shard} -> {to or 'any'}"
        try:
            self.targets.coordinator.request_failover(shard, to=to, by="chaos", timeout_s=10.0)
        except FailoverRefused as exc:
            return target, f"refused: {exc}"
        return target, "applied: requested"

    def _partition_node(self) -> tuple[str, str]:
        t = self.targets
        assert t.netns is not None and t.netns_node is not None
        name = t.netns_node
        led = tuple(
            s for s in t.shards if (info := t.coordinator.leader_of(s)) and info.node == name
        )

        def taken_over() -> bool:
            for shard in led:
                info = t.coordinator.leader_of(shard)
                if info is None or info.node == name or info.status != "consuming":
                    return False
            return True

        cut_at = time.time()
        t.netns.cut()
        took = True
        try:
            try:
                wait_until(taken_over, timeout=45.0, what="takeover", interval=0.5)
            except DevstackError:
                took = False
            time.sleep(self.rng.uniform(1.0, 3.0))
        finally:
            t.netns.heal()
        healed_at = time.time()
        fence = cut_at + self.session_timeout
        during = tuple(
            c
            for c in read_commits({name: t.cluster.nodes[name].log_path})
            if fence < c.at < healed_at
        )
        self.partitions.append(Partition(name, led, cut_at, healed_at, took, during))
        return (
            f"{name} (leading shards {list(led)})",
            f"applied: cut off {healed_at - cut_at:.1f}s, "
            f"{('taken over' if took else 'NOT taken over') if led else 'was not leading'}, "
            f"{len(during)} commits while cut",
        )

    def _zk_reply_lost(self) -> tuple[str, str]:
        """A node's election or resignation multi-op reaches ZooKeeper and its reply is lost
        with the connection (the session survives): a failover of a shard it leads (its
        resign), or the kill of the leader of a shard it follows (its election)."""
        t = self.targets
        shard, leader, node = self._leader()
        followers = sorted(
            n
            for n, d in t.cluster.nodes.items()
            if n != leader and shard in d.configured_shards() and n in t.zk_proxies
        )
        if leader not in t.zk_proxies and not followers:
            raise _Skip(f"no node of shard {shard} talks to ZooKeeper through a proxy")
        if leader in t.zk_proxies and (self.rng.random() < 0.5 or not followers):
            victim, how = leader, "resign"
            t.zk_proxies[victim].drop_reply_to(Op.MULTI)
            try:
                t.coordinator.request_failover(shard, by="chaos", timeout_s=10.0)
            except FailoverRefused as exc:
                t.zk_proxies[victim].disarm()
                return f"{leader} (leader of shard {shard})", f"refused: {exc}"
        else:
            victim, how = self.rng.choice(followers), "election"
            t.zk_proxies[victim].drop_reply_to(Op.MULTI)
            node.kill(signal.SIGKILL)
        proxy = t.zk_proxies[victim]
        lost = proxy.dropped_event.wait(15.0)
        proxy.disarm()
        if how == "election":
            time.sleep(self.rng.uniform(1.0, 2.0))
            t.start_node(leader)
        outcome = "reply lost" if lost else "no multi-op sent in 15 s (another node acted)"
        return f"{victim} ({how} in shard {shard})", f"applied: {outcome}"

    def _zk_frozen(self) -> tuple[str, str]:
        """The ZooKeeper server freezes for one leader: its connection is cut and the
        replies on the new one are held past the request timeout, while the connection
        stays up (no second CONNECTED comes to re-check the suspended term). Under a short
        session the hold is just past the request timeout; under a long one (10 s or more,
        where kazoo keeps a silent connection for 2/3 of it) it is `FROZEN_SHARE` of the
        session: many request timeouts in a row on one live connection."""
        t = self.targets
        leaders = [
            (shard, info.node)
            for shard in t.shards
            if (info := t.coordinator.leader_of(shard)) is not None and info.node in t.zk_proxies
        ]
        if not leaders:
            raise _Skip("no shard's leader talks to ZooKeeper through a proxy")
        sessions = {
            n: load_config(t.cluster.nodes[n].config_path).zookeeper.session_timeout
            for n in {n for _, n in leaders}
        }
        # Half of the time a leader with a long session where one leads: its case is rarer.
        long = [(s, n) for s, n in leaders if sessions[n] >= LONG_SESSION_S]
        shard, name = self.rng.choice(long if long and self.rng.random() < 0.5 else leaders)
        session = sessions[name]
        stall = session * FROZEN_SHARE if session >= LONG_SESSION_S else t.request_timeout + 0.3
        proxy = t.zk_proxies[name]
        proxy.stall_next_connection(stall)
        proxy.cut()
        time.sleep(stall + 1.0)
        return (
            f"{name} (leader of shard {shard}, session {session:g}s)",
            f"applied: replies held {stall:.1f}s",
        )

    def _ops_command_killed(self) -> tuple[str, str]:
        """An operator command SIGKILLed half-way (a lost ssh session): `hakafka reshard` as
        soon as its request exists, or `hakafka pending drop` as soon as its pause exists.
        What it left behind must end by its deadline; waits until it has (bounded)."""
        t = self.targets
        config = t.cluster.nodes[min(t.cluster.nodes)].config_path
        shard = self.rng.choice(t.shards)
        if self.rng.random() < 0.5 and len(t.shards) < 3:
            staged = config.with_suffix(".killed-reshard.toml")
            staged.write_text(t.cluster.layout_configs({"n1": [0, 1, 2]}, 3)["n1"])
            args = ["reshard", "--config", str(staged), "--timeout", "3"]
            what = "reshard"
        else:
            args = ["pending", "drop", "--config", str(config), "--shard", str(shard)]
            args += ["--pipeline", "events", "--wait", "3"]
            what = f"pending drop (shard {shard})"

        def left() -> bool:
            """What the command writes first is there (and not yet ended)."""
            if what == "reshard":
                return t.coordinator.reshard.read() is not None
            return bool(t.coordinator.pauses.paused(shard))

        proc = subprocess.Popen(
            [sys.executable, "-m", "hakafka.cli", *args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            wait_until(left, timeout=20.0, what=f"{what} to write its request", interval=0.02)
        finally:
            proc.kill()
            proc.wait(10)
        killed = time.monotonic()
        wait_until(lambda: not left(), timeout=60.0, what=f"what {what} left to end", interval=0.2)
        ended = time.monotonic() - killed
        return what, f"applied: SIGKILL half-way, what it left ended {ended:.1f}s later"

    # -- reshard ----------------------------------------------------------------------------

    def reshard(self, plan: ReshardPlan) -> ReshardAttempt:
        """Reshard the running cluster to `plan`'s layout now: write each node's new config
        next to its own (`<node>.reshard.toml`) and run `hakafka reshard` with one of them;
        when it moved the layout, put each node's new config in place, restart the node
        (SIGTERM, start) and wait until every shard of the new layout has a consuming
        leader. The attempt is recorded in `reshards` and said."""
        t = self.targets
        self._restart_unplanned_exits()
        texts = t.cluster.layout_configs(plan.layout, plan.shard_count)
        staged = {n: t.cluster.nodes[n].config_path.with_suffix(".reshard.toml") for n in texts}
        for name, path in staged.items():
            path.write_text(texts[name])
        at = round(time.monotonic() - self.began, 2)
        began = time.monotonic()
        self.say(f"chaos: t={at:.1f}s reshard to {plan.shard_count} shards requested")
        config = ["--config", str(staged[min(staged)])]
        resharded, output = _hakafka(
            ["reshard", *config, "--timeout", f"{plan.timeout:g}"], plan.timeout + 60.0
        )
        if not resharded:
            # A command that did not end may have left its request: the leaders stay drained.
            _hakafka(["reshard", *config, "--abort"], 60.0)
            attempt = ReshardAttempt(at, False, (), None, output)
        else:
            moves = tuple(line for line in output.splitlines() if " -> shard " in line)
            for name, text in texts.items():
                node = t.cluster.nodes[name]
                node.config_path.write_text(text)
                node.stop()
                t.start_node(name)
            t.shards = list(range(plan.shard_count))
            try:
                t.cluster.wait_leaders(t.shards, timeout=plan.consuming_timeout)
                attempt = ReshardAttempt(at, True, moves, round(time.monotonic() - began, 2))
            except DevstackError as exc:
                attempt = ReshardAttempt(at, True, moves, None, str(exc))
        self.reshards.append(attempt)
        self.say(f"chaos: reshard {attempt.describe()}")
        return attempt

    # -- healing ----------------------------------------------------------------------------

    def heal(self, timeout: float = 90.0) -> None:
        """Undo whatever is still broken: continue stopped daemons, clear replacements,
        start ZooKeeper members, the broker, the ClickHouse front and dead daemons."""
        t = self.targets
        if t.netns is not None:
            t.netns.heal()
        for node in t.cluster.nodes.values():
            if node.alive():
                node.kill(signal.SIGCONT)
        for member in t.zookeeper.members:
            if member.process is None or not member.process.alive():
                t.zookeeper.start_member(member.myid, timeout=30.0)
        if not t.broker.healthy():
            with t.broker_lock:
                t.broker.restart(timeout=30.0)
        if not t.clickhouse.healthy():
            t.clickhouse.stop()
            t.clickhouse.start(timeout=30.0)
        for name in list(t.coordinator.replacing()):
            t.coordinator.clear_replacing(name)
        self._restart_unplanned_exits()
        for node in t.cluster.nodes.values():
            node.wait_up(timeout)

    def summary(self) -> str:
        """How many faults of each kind were applied, refused or skipped."""
        counts: dict[str, dict[str, int]] = {}
        for f in self.faults:
            result = f.outcome.split(":", 1)[0]
            counts.setdefault(f.kind, {}).setdefault(result, 0)
            counts[f.kind][result] += 1
        parts = [
            f"{kind} " + "/".join(f"{n} {r}" for r, n in sorted(results.items()))
            for kind, results in sorted(counts.items())
        ]
        return f"seed {self.seed}, {len(self.faults)} faults: " + ", ".join(parts)

    def reshard_summary(self) -> str:
        """Every reshard attempt of the run, one after the other."""
        return "reshard: " + ("; ".join(a.describe() for a in self.reshards) or "none")


def _hakafka(args: Sequence[str], timeout: float) -> tuple[bool, str]:
    """Run `hakafka ARGS` (bounded by `timeout` s): whether it exited 0, and its output
    (the last lines of it, joined by " | ", when it did not)."""
    try:
        done = run_hakafka(args, timeout)
    except subprocess.TimeoutExpired:
        return False, f"hakafka {' '.join(args)}: no answer within {timeout:g} s"
    output = (done.stdout + done.stderr).decode(errors="replace")
    if done.returncode == 0:
        return True, output
    tail = [line.strip() for line in output.splitlines() if line.strip()][-3:]
    return False, f"exit {done.returncode}: " + " | ".join(tail)
