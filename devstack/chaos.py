"""Chaos for a local hakafka cluster: a seeded schedule of bounded faults, a leadership
watcher, and the end-of-run checks (no doubled leader, no WAL damage).

`ChaosDriver.run` applies faults picked by `random.Random(seed)`: SIGKILL or SIGSTOP a shard
leader, SIGKILL and restart a ZooKeeper member, restart the broker, stop the ClickHouse front
for a while, mark and clear a node's replacement, ask for failovers and, where a daemon runs in
a `NetworkNamespace` of its own (root and iproute2 needed), cut its veth link so it is really
partitioned from ZooKeeper, the broker and ClickHouse. Every fault ends by
itself (a stopped process is continued, a stopped service started again) and `heal` brings
back anything still down. With a `ReshardPlan`, the driver also reshards the running cluster
between two faults (`hakafka reshard` with the new layout, then every node restarted with
its new config from `LocalCluster.layout_configs`) and records the attempt. The seed comes
from `CHAOS_SEED` when set, so a run can be replayed (the schedule is the same; timing on a
busy machine is not).

`LeadershipWatcher` records every change of `shards/<s>/leader` from its own ZooKeeper
session. `commit_violations` reads each daemon's JSON log for `fenced.checkpoint_committed`
and says whether two nodes ever committed for the same shard and epoch or a shard's epochs
went backwards; `verify_wals` runs `python -m wal verify` on every WAL directory.
`election_timings` reads, for every `leader.elected` of every daemon, how long it took until
that node's `leader.consuming` for the shard (or why it never got there); `consuming_summary`
is the distribution the run prints and `too_slow` what fails the long run. `flush_report`
reads every committed block's task count and every re-flush with the node that wrote the
intent it followed (`fenced.pending_written`), so the run can show blocks of several tasks
and re-flushes across nodes of different `rows_per_task`, each in the writer's task count.
`python -m devstack.chaos forward LHOST:LPORT=THOST:TPORT ...` is the TCP forwarder
that carries a namespaced daemon's traffic to the services on 127.0.0.1.

WAL damage, as these checks define it: a torn tail (a record cut short by SIGKILL) is
expected and repaired when the log is opened, so it is reported but not damage; a corrupt
record (CRC mismatch, impossible length, missing segment) and any quarantined `*.corrupt`
file are damage.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kazoo.client import KazooClient

from devstack.clickhouse import ClickHouseService
from devstack.cluster import DaemonNode, LocalCluster
from devstack.kafka import KafkaBroker
from devstack.process import LOOPBACK, DevstackError, ManagedProcess, run_hakafka, wait_until
from devstack.zk_proxy import Op, ZkProxy
from devstack.zookeeper import ZooKeeperEnsemble
from hakafka.config import load_config
from hakafka.coordination import paths
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


def chaos_seed() -> int:
    """The seed of this run: `CHAOS_SEED` if set (an integer), else a fresh random one."""
    raw = os.environ.get(SEED_ENV, "").strip()
    if not raw:
        return random.SystemRandom().randrange(2**32)
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{SEED_ENV}={raw!r}: the seed must be an integer") from None


# -- leadership watcher -----------------------------------------------------------------------


@dataclass(frozen=True)
class LeaderObservation:
    """One state of `shards/<shard>/leader` as seen at `at` (Unix time); node None: no leader."""

    at: float
    shard: int
    node: str | None
    epoch: int | None
    status: str | None


class LeadershipWatcher:
    """Watches the leader znode of each shard from its own session and records every change."""

    def __init__(self, hosts: str, root: str, shards: Iterable[int]) -> None:
        self._client = KazooClient(hosts=f"{hosts}{root}", timeout=10.0)
        self._shards = list(shards)
        self._lock = threading.Lock()
        self._seen: list[LeaderObservation] = []

    def start(self, timeout: float = 15.0) -> None:
        self._client.start(timeout=timeout)
        for shard in self._shards:
            self._client.DataWatch(paths.leader(shard), self._recorder(shard))

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self._client.stop()
        with contextlib.suppress(Exception):
            self._client.close()

    def _recorder(self, shard: int) -> Callable[[bytes | None, Any], None]:
        def record(data: bytes | None, _stat: Any) -> None:
            node: str | None = None
            epoch: int | None = None
            status: str | None = None
            if data:
                try:
                    value = json.loads(data)
                    node, epoch, status = value["node"], int(value["epoch"]), value.get("status")
                except (ValueError, KeyError, TypeError):
                    node, status = f"<unreadable {data[:60]!r}>", "unreadable"
            with self._lock:
                self._seen.append(LeaderObservation(time.time(), shard, node, epoch, status))

        return record

    def observations(self) -> list[LeaderObservation]:
        with self._lock:
            return list(self._seen)

    def current(self, shard: int) -> str | None:
        """The node last seen leading `shard`, or None."""
        for seen in reversed(self.observations()):
            if seen.shard == shard:
                return seen.node
        return None

    def violations(self) -> list[str]:
        """Leader changes that break "one leader per epoch, epochs only grow" per shard."""
        return leader_violations(self.observations())


def leader_violations(observations: Iterable[LeaderObservation]) -> list[str]:
    """Per shard, in observation order: an epoch never comes back with another node, and
    never goes backwards."""
    problems: list[str] = []
    last: dict[int, LeaderObservation] = {}
    for seen in observations:
        if seen.node is None or seen.epoch is None:
            continue
        before = last.get(seen.shard)
        if before is not None and before.epoch is not None:
            if seen.epoch == before.epoch and seen.node != before.node:
                problems.append(
                    f"shard {seen.shard}: epoch {seen.epoch} held by {before.node} and then "
                    f"by {seen.node} (at {seen.at:.3f})"
                )
            elif seen.epoch < before.epoch:
                problems.append(
                    f"shard {seen.shard}: epoch went back from {before.epoch} ({before.node}) "
                    f"to {seen.epoch} ({seen.node}) at {seen.at:.3f}"
                )
        last[seen.shard] = seen
    return problems


# -- checks over the daemons' logs and WALs -----------------------------------------------------


@dataclass(frozen=True)
class Commit:
    """One `fenced.checkpoint_committed` event of a daemon's log."""

    at: float
    node: str
    shard: int
    pipeline: str
    epoch: int


# A node's log: one file, or the files it was rotated into (oldest first, current last).
LogFiles = Path | Sequence[Path]


def log_files(log_path: Path) -> list[Path]:
    """`log_path` and the files a rotation moved it to (`<name>.1`, `<name>.2`, ...),
    oldest first: every log a daemon wrote there. The devstack appends every process of a
    node to the one file (`ManagedProcess` opens it in append mode), so today this is
    `[log_path]`; rotated siblings are read too so that no run's lines are missed."""
    rotated = [
        (int(m.group(1)), p)
        for p in log_path.parent.glob(f"{log_path.name}.*")
        if (m := re.fullmatch(re.escape(log_path.name) + r"\.(\d+)", p.name)) and p.is_file()
    ]
    return [p for _, p in sorted(rotated, reverse=True)] + [log_path]


def daemon_logs(cluster: LocalCluster) -> dict[str, list[Path]]:
    """node name -> every log file of that daemon (see `log_files`)."""
    return {name: log_files(node.log_path) for name, node in cluster.nodes.items()}


def _files(logs: LogFiles) -> list[Path]:
    return [logs] if isinstance(logs, Path) else list(logs)


def log_events(logs: LogFiles, names: Iterable[str]) -> list[dict[str, Any]]:
    """The JSON log lines of `logs` (one file or several, read in that order) whose `event`
    is one of `names` (others skipped)."""
    wanted = set(names)
    found: list[dict[str, Any]] = []
    for log_path in _files(logs):
        if not log_path.exists():
            continue
        for line in log_path.read_text(errors="replace").splitlines():
            if not line.startswith("{"):
                continue
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if isinstance(value, dict) and value.get("event") in wanted:
                found.append(value)
    return found


def _unix(timestamp: str) -> float:
    return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()


def _iso_now() -> str:
    """Now, as the daemons' structlog `TimeStamper(fmt="iso", utc=True)` writes it."""
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def read_commits(logs: Mapping[str, LogFiles]) -> list[Commit]:
    """Every checkpoint commit of every node (node name -> its log files), in time order."""
    commits = [
        Commit(_unix(e["timestamp"]), node, int(e["shard"]), str(e["pipeline"]), int(e["epoch"]))
        for node, files in logs.items()
        for e in log_events(files, ["fenced.checkpoint_committed"])
    ]
    return sorted(commits, key=lambda c: c.at)


# -- flush plans: blocks of several tasks, re-flushes across rows_per_task ---------------------


def configured_rows_per_task(config_paths: Mapping[str, Path]) -> dict[str, int]:
    """node name -> its `[spark] rows_per_task`, read from its config as the daemon reads it."""
    return {node: load_config(p).spark.rows_per_task for node, p in config_paths.items()}


def planned_tasks(rows: int, rows_per_task: int) -> int:
    """How many tasks a block of `rows` rows gets when planned with `rows_per_task`
    (`pipeline.blockplan`: ceil(rows / rows_per_task); a block without rows is one task)."""
    return max(1, math.ceil(rows / rows_per_task))


@dataclass(frozen=True)
class BlockCommit:
    """One `flush.committed` of a daemon's log: the block, its rows and its flush tasks."""

    at: float
    node: str
    shard: int
    block: str
    rows: int
    tasks: int


@dataclass(frozen=True)
class Reflush:
    """One `pending.reflush` of `node`: the block it flushed again, who wrote the intent it
    followed (the node whose `fenced.pending_written` of that shard and block came last
    before it; None when no log says), both nodes' `rows_per_task`, and the tasks of its
    `flush.committed` (None: this re-flush never committed, e.g. abandoned)."""

    at: float
    node: str
    shard: int
    block: str
    rows: int
    rows_per_task: int
    writer: str | None
    writer_rows_per_task: int | None
    committed_tasks: int | None

    @property
    def across(self) -> bool:
        """The re-flushing node's rows_per_task differs from the intent writer's."""
        return self.writer_rows_per_task not in (None, self.rows_per_task)

    @property
    def off_plan(self) -> bool:
        """It committed a task count other than its writer planned: it planned again."""
        if self.writer_rows_per_task is None or self.committed_tasks is None:
            return False
        return self.committed_tasks != planned_tasks(self.rows, self.writer_rows_per_task)

    def describe(self) -> str:
        writer = self.writer or "?"
        return (
            f"{self.node} shard {self.shard} block {self.block} ({self.rows} rows, "
            f"rows_per_task {self.rows_per_task}) written by {writer} (rows_per_task "
            f"{self.writer_rows_per_task}): committed in {self.committed_tasks} tasks"
        )


@dataclass(frozen=True)
class FlushReport:
    """Every block commit and every re-flush of a run, from the daemons' logs."""

    commits: tuple[BlockCommit, ...]
    reflushes: tuple[Reflush, ...]

    def wide(self, tasks: int = 3) -> list[BlockCommit]:
        """The committed blocks of at least `tasks` tasks."""
        return [c for c in self.commits if c.tasks >= tasks]

    def off_plan(self) -> list[str]:
        """Re-flushes that did not follow their intent's plan (must be none)."""
        return [r.describe() for r in self.reflushes if r.off_plan]

    def summary(self) -> str:
        """One line: blocks by task count, the largest, and the re-flushes across nodes of
        different rows_per_task (committed ones: in the writer's task count, and how many of
        them their own rows_per_task would have cut otherwise)."""
        by_tasks: dict[int, int] = {}
        for c in self.commits:
            by_tasks[c.tasks] = by_tasks.get(c.tasks, 0) + 1
        largest = max(self.commits, key=lambda c: (c.rows, c.tasks), default=None)
        across = [r for r in self.reflushes if r.across]
        done = [r for r in across if r.committed_tasks is not None]
        telling = [
            r
            for r in done
            if planned_tasks(r.rows, r.rows_per_task)
            != planned_tasks(r.rows, r.writer_rows_per_task or r.rows_per_task)
        ]
        return (
            f"blocks committed: {len(self.commits)}, by tasks "
            f"{dict(sorted(by_tasks.items()))}, with >= 3 tasks: {len(self.wide())}"
            + ("" if largest is None else f", largest {largest.rows} rows in {largest.tasks}")
            + f"; re-flushes: {len(self.reflushes)} (intent writer unknown: "
            f"{sum(r.writer is None for r in self.reflushes)}), on a node with another "
            f"rows_per_task than the writer: {len(across)}, committed {len(done)}, in the "
            f"writer's task count {sum(not r.off_plan for r in done)}, where their own "
            f"rows_per_task would have cut otherwise {len(telling)}"
        )


def flush_report(logs: Mapping[str, LogFiles], rows_per_task: Mapping[str, int]) -> FlushReport:
    """The `FlushReport` of `logs` (node name -> its log files) for nodes configured with
    `rows_per_task` (node name -> value). A re-flush is matched to the first
    `flush.committed` of its block on its node and shard before that node re-flushes the
    block again."""
    events = sorted(
        (
            (_unix(e["timestamp"]), node, e)
            for node, files in logs.items()
            for e in log_events(
                files, ["fenced.pending_written", "pending.reflush", "flush.committed"]
            )
            if isinstance(e.get("timestamp"), str)
        ),
        key=lambda item: item[0],
    )
    writers: dict[tuple[int, str], str] = {}  # (shard, block) -> its last writer so far
    open_: dict[tuple[str, int, str], int] = {}  # (node, shard, block) -> index in reflushes
    commits: list[BlockCommit] = []
    reflushes: list[Reflush] = []
    for at, node, e in events:
        shard, block = int(e["shard"]), str(e["block"])
        key = (node, shard, block)
        if e["event"] == "fenced.pending_written":
            writers[(shard, block)] = node
        elif e["event"] == "pending.reflush":
            writer = writers.get((shard, block))
            open_[key] = len(reflushes)
            reflushes.append(
                Reflush(
                    at,
                    node,
                    shard,
                    block,
                    int(e["rows"]),
                    rows_per_task[node],
                    writer,
                    None if writer is None else rows_per_task[writer],
                    None,
                )
            )
        else:
            commits.append(BlockCommit(at, node, shard, block, int(e["rows"]), int(e["tasks"])))
            if (i := open_.pop(key, None)) is not None:
                reflushes[i] = replace(reflushes[i], committed_tasks=int(e["tasks"]))
    return FlushReport(tuple(commits), tuple(reflushes))


# -- election -> consuming ----------------------------------------------------------------------

# Written by `ChaosTargets.start_node` into a daemon's log just before it starts a process, so
# a restart is visible in the log (a SIGKILLed process leaves no last line of its own, and the
# new one may win an election before it logs `daemon.started`).
NODE_STARTING = "chaos.daemon_starting"
# Above the ZooKeeper session timeout, the time a leader change may take to consume.
CONSUMING_MARGIN_S = 5.0
# Events after which an election of (node, shard) can no longer reach `leader.consuming` in
# that term, and the outcome recorded for it. `leader.recovery_failed` (renamed
# `leader.handed_over` for a hand-over) counts as "never consumed", as agreed for #20: a
# pipeline restarted later in the same term may still log `leader.consuming`; that line is
# then not a sample. Node-wide events (no `shard`) end every open election of the node.
ELECTION_ENDS = {
    "leader.lost": "lost",
    "leader.handed_over": "handed over",
    "leader.recovery_failed": "recovery failed",
    "leader.elected": "elected again",
    "daemon.stopping": "daemon stopped",
    NODE_STARTING: "daemon restarted",
}
LOG_ENDED = "log ended"
# What a term's pipeline logs once it committed a checkpoint (with `shard` and `epoch`).
CHECKPOINT_COMMITTED = "fenced.checkpoint_committed"


@dataclass(frozen=True)
class ElectionTiming:
    """One `leader.elected` of `node` for `shard`: when, and when that node then logged
    `leader.consuming` for the shard (None: never; `outcome` says what ended the term
    first). `reported` is the consuming line's own `seconds`, which counts from the start of
    the pipelines (after the old ones stopped and the new ones were built), not from the
    election, and so is not the sample."""

    node: str
    shard: int
    epoch: int
    elected_at: float
    consuming_at: float | None
    outcome: str  # "consuming", or a value of ELECTION_ENDS, or LOG_ENDED
    reported: float | None = None
    checkpoint_at: float | None = None  # the term's first checkpoint commit (any pipeline)

    @property
    def seconds(self) -> float | None:
        """Seconds from `leader.elected` to `leader.consuming` (log timestamps), or None."""
        return None if self.consuming_at is None else self.consuming_at - self.elected_at

    @property
    def to_checkpoint(self) -> float | None:
        """Seconds from `leader.elected` to the term's first checkpoint, or None (none)."""
        return None if self.checkpoint_at is None else self.checkpoint_at - self.elected_at

    def describe(self) -> str:
        told = "" if self.reported is None else f", its pipelines {self.reported:.2f} s"
        took = "never consumed" if self.seconds is None else f"{self.seconds:.2f} s{told}"
        return f"{self.node} shard {self.shard} epoch {self.epoch}: {took}"


def election_timings(logs: Mapping[str, LogFiles]) -> list[ElectionTiming]:
    """Every `leader.elected` of every node (node name -> its log files), in election order,
    with the time until the next `leader.consuming` of the same node and shard, if one
    comes before that node's next `leader.elected`, `leader.lost`, hand-over, failed
    recovery, stop or restart for the shard (`ELECTION_ENDS`)."""
    wanted = ["leader.consuming", *ELECTION_ENDS]
    timings: list[ElectionTiming] = []
    for node, files in logs.items():
        events = [e for e in log_events(files, wanted) if isinstance(e.get("timestamp"), str)]
        firsts = _first_checkpoints(log_events(files, [CHECKPOINT_COMMITTED]))
        timings += [
            replace(t, checkpoint_at=firsts.get((t.shard, t.epoch)))
            for t in _node_timings(node, sorted(events, key=lambda e: _unix(e["timestamp"])))
        ]
    return sorted(timings, key=lambda t: (t.elected_at, t.node, t.shard))


def _first_checkpoints(events: Iterable[dict[str, Any]]) -> dict[tuple[int, int], float]:
    """(shard, epoch) -> time of that term's first checkpoint commit, from one node's log."""
    firsts: dict[tuple[int, int], float] = {}
    for e in events:
        if isinstance(e.get("timestamp"), str) and "shard" in e and "epoch" in e:
            key, at = (int(e["shard"]), int(e["epoch"])), _unix(e["timestamp"])
            firsts[key] = min(at, firsts.get(key, at))
    return firsts


def _node_timings(node: str, events: Iterable[dict[str, Any]]) -> list[ElectionTiming]:
    """`election_timings` of one node, from its events in time order."""
    timings: list[ElectionTiming] = []
    open_: dict[int, dict[str, Any]] = {}  # shard -> its `leader.elected` line

    def close(shard: int, outcome: str, consuming: dict[str, Any] | None = None) -> None:
        elected = open_.pop(shard)
        reported = None if consuming is None else consuming.get("seconds")
        timings.append(
            ElectionTiming(
                node,
                shard,
                int(elected["epoch"]),
                _unix(elected["timestamp"]),
                None if consuming is None else _unix(consuming["timestamp"]),
                outcome,
                None if reported is None else float(reported),
            )
        )

    for e in events:
        name, shard = e["event"], e.get("shard")
        shards = list(open_) if shard is None else [int(shard)] if int(shard) in open_ else []
        for s in shards:
            if name == "leader.consuming":
                close(s, "consuming", e)
            else:
                close(s, ELECTION_ENDS[name])
        if name == "leader.elected" and shard is not None:
            open_[int(shard)] = e
    for s in list(open_):
        close(s, LOG_ENDED)
    return timings


def consuming_bound(config_paths: Iterable[Path]) -> float:
    """Session timeout + `CONSUMING_MARGIN_S`: the longest `[zookeeper] session_timeout` of
    the daemons' configs (read as the daemons read them) plus the margin."""
    timeouts = [load_config(p).zookeeper.session_timeout for p in config_paths]
    return max(timeouts) + CONSUMING_MARGIN_S


def _nearest_rank(ordered: Sequence[float], q: float) -> float:
    """The `q` quantile (0 < q <= 1) of sorted `ordered` by nearest rank: a value of the
    sample, the largest when there are fewer than 1/(1-q) of them."""
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def consuming_summary(timings: Iterable[ElectionTiming], bound: float) -> str:
    """The distribution of election -> consuming, one line: `N changes, min, median, p90,
    p99, max (the slowest), how many over `bound`, and the elections that never consumed
    by what ended them first."""
    timings = list(timings)
    samples = [t for t in timings if t.seconds is not None]
    never: dict[str, int] = {}
    for t in timings:
        if t.seconds is None:
            never[t.outcome] = never.get(t.outcome, 0) + 1
    why = ", ".join(f"{n} {outcome}" for outcome, n in sorted(never.items()))
    never_text = f"never consumed: {sum(never.values())}" + (f" ({why})" if why else "")
    if not samples:
        return f"election -> consuming: 0 changes; {never_text}"
    seconds = sorted(t.seconds for t in samples if t.seconds is not None)
    slowest = max(samples, key=lambda t: t.seconds or 0.0)
    over = sum(s > bound for s in seconds)
    return (
        f"election -> consuming: {len(seconds)} changes, min {seconds[0]:.2f} s, "
        f"median {statistics.median(seconds):.2f} s, p90 {_nearest_rank(seconds, 0.9):.2f} s, "
        f"p99 {_nearest_rank(seconds, 0.99):.2f} s, max {seconds[-1]:.2f} s "
        f"({slowest.node} shard {slowest.shard} epoch {slowest.epoch}); "
        f"over {bound:.1f} s: {over}; {never_text}"
    )


def checkpoint_summary(timings: Iterable[ElectionTiming]) -> str:
    """The distribution of election -> the term's first checkpoint, one line: `N terms, min,
    median, p90, p99, max (the slowest), and how many terms ended without one (lost, handed
    over, stopped before a block was due, or nothing to flush)."""
    timings = list(timings)
    seconds = sorted(t.to_checkpoint for t in timings if t.to_checkpoint is not None)
    without = len(timings) - len(seconds)
    if not seconds:
        return f"election -> first checkpoint: 0 terms; without one: {without}"
    slowest = max(timings, key=lambda t: t.to_checkpoint or 0.0)
    return (
        f"election -> first checkpoint: {len(seconds)} terms, min {seconds[0]:.2f} s, "
        f"median {statistics.median(seconds):.2f} s, p90 {_nearest_rank(seconds, 0.9):.2f} s, "
        f"p99 {_nearest_rank(seconds, 0.99):.2f} s, max {seconds[-1]:.2f} s "
        f"({slowest.node} shard {slowest.shard} epoch {slowest.epoch}); without one: {without}"
    )


def too_slow(timings: Iterable[ElectionTiming], bound: float) -> str | None:
    """None if every election reached consuming within `bound` s; else a message naming the
    slowest change first (node, shard, epoch, seconds) and listing every other one over."""
    over = sorted(
        (t for t in timings if t.seconds is not None and t.seconds > bound),
        key=lambda t: -(t.seconds or 0.0),
    )
    if not over:
        return None
    slowest, *others = over
    also = f"; also over: {[t.describe() for t in others]}" if others else ""
    return (
        f"slowest leader change {slowest.describe()} from leader.elected to "
        f"leader.consuming, over the bound of {bound:.1f} s (session timeout + "
        f"{CONSUMING_MARGIN_S:.0f} s); {len(over)} over{also}"
    )


def commit_violations(
    commits: Iterable[Commit], observations: Iterable[LeaderObservation] = ()
) -> list[str]:
    """Commits that show a doubled leader: one (shard, epoch) committed by two nodes, a
    shard's epochs going backwards in commit order, or a commit by a node the watcher saw
    holding that epoch under another name."""
    problems: list[str] = []
    owner: dict[tuple[int, int], str] = {}
    latest: dict[tuple[int, str], Commit] = {}
    watched = {(o.shard, o.epoch): o.node for o in observations if o.epoch is not None}
    for c in commits:
        first = owner.setdefault((c.shard, c.epoch), c.node)
        if first != c.node:
            problems.append(
                f"shard {c.shard} epoch {c.epoch}: checkpoints committed by {first} and {c.node}"
            )
        before = latest.get((c.shard, c.pipeline))
        if before is not None and c.epoch < before.epoch:
            problems.append(
                f"shard {c.shard} {c.pipeline}: {c.node} committed epoch {c.epoch} after "
                f"{before.node} committed epoch {before.epoch}"
            )
        latest[(c.shard, c.pipeline)] = c
        seen = watched.get((c.shard, c.epoch))
        if seen is not None and seen != c.node:
            problems.append(
                f"shard {c.shard} epoch {c.epoch}: {c.node} committed but the leader znode "
                f"named {seen}"
            )
    return problems


@dataclass(frozen=True)
class WalCheck:
    """`python -m wal verify` on one WAL directory."""

    directory: Path
    exit_code: int
    output: str
    quarantined: tuple[str, ...]

    @property
    def torn_tail(self) -> bool:
        return "TORN TAIL" in self.output

    @property
    def damaged(self) -> bool:
        return self.exit_code not in (0, 1) or "CORRUPT" in self.output or bool(self.quarantined)


def wal_directories(data_dirs: Iterable[Path]) -> list[Path]:
    """Every `<data_dir>/wal/<shard>/<pipeline>` directory."""
    return sorted(p for d in data_dirs for p in (d / "wal").glob("*/*") if p.is_dir())


def verify_wals(data_dirs: Iterable[Path], timeout: float = 60.0) -> list[WalCheck]:
    """Run `python -m wal verify` on every WAL directory of `data_dirs` (daemons stopped)."""
    checks = []
    for directory in wal_directories(data_dirs):
        done = subprocess.run(
            [sys.executable, "-m", "wal", "verify", str(directory)],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        quarantined = tuple(sorted(p.name for p in directory.glob("*.corrupt")))
        checks.append(WalCheck(directory, done.returncode, done.stdout + done.stderr, quarantined))
    return checks


def repaired_corruption(logs: Mapping[str, LogFiles]) -> list[str]:
    """`wal.repaired` events (WAL opened after a crash) whose report names a corruption."""
    return [
        f"{node}: {e.get('directory')}: {e.get('report')}"
        for node, files in logs.items()
        for e in log_events(files, ["wal.repaired"])
        if "corruption=None" not in str(e.get("report"))
    ]


# -- a daemon in its own network namespace ----------------------------------------------------


def netns_unavailable() -> str | None:
    """Why a daemon cannot run in a network namespace of its own here, or None if it can."""
    if os.geteuid() != 0:
        return "not root: creating a network namespace and a veth pair needs CAP_NET_ADMIN"
    if shutil.which("ip") is None:
        return "iproute2 is not installed (no `ip` command): apt-get install iproute2"
    return None


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10, check=False)
    if done.returncode != 0:
        raise DevstackError(f"`ip {' '.join(args)}` failed: {done.stderr.strip()}")


class NetworkNamespace:
    """A network namespace joined to the root one by a veth pair (`root_addr`/30 on our side,
    `ns_addr` inside), with TCP forwarders so that a daemon inside reaches the services on
    127.0.0.1 of the root namespace, and the tests reach its admin port, at the same
    addresses as everywhere else. `cut` takes the veth link down: nothing gets through either
    way until `heal`. Only the loopback addresses and this veth pair ever carry traffic."""

    def __init__(
        self,
        name: str,
        root: Path,
        *,
        root_addr: str = "10.213.0.1",
        ns_addr: str = "10.213.0.2",
    ) -> None:
        self.name = paths.check_name("namespace", name)
        self.root = root
        self.root_addr, self.ns_addr = root_addr, ns_addr
        self.veth_root, self.veth_ns = f"{name[:13]}a", f"{name[:13]}b"
        self.forwarders: list[ManagedProcess] = []
        self._created = False

    @property
    def exec_prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.name]

    def create(self) -> None:
        """Create the namespace and the veth pair (raises DevstackError saying what failed)."""
        _ip("netns", "add", self.name)
        self._created = True
        _ip("link", "add", self.veth_root, "type", "veth", "peer", "name", self.veth_ns)
        _ip("link", "set", self.veth_ns, "netns", self.name)
        _ip("addr", "add", f"{self.root_addr}/30", "dev", self.veth_root)
        _ip("link", "set", self.veth_root, "up")
        inside = ["netns", "exec", self.name, "ip"]
        _ip(*inside, "addr", "add", f"{self.ns_addr}/30", "dev", self.veth_ns)
        _ip(*inside, "link", "set", self.veth_ns, "up")
        _ip(*inside, "link", "set", "lo", "up")

    def forward(self, service_ports: Iterable[int], admin_ports: Iterable[int]) -> None:
        """Start the forwarders: the namespace's 127.0.0.1:<service port> reaches the root's,
        the root's 127.0.0.1:<admin port> reaches the namespace's."""
        services, admins = list(service_ports), list(admin_ports)
        outside = [f"{self.root_addr}:{p}={LOOPBACK}:{p}" for p in services] + [
            f"{LOOPBACK}:{p}={self.ns_addr}:{p}" for p in admins
        ]
        inside = [f"{LOOPBACK}:{p}={self.root_addr}:{p}" for p in services] + [
            f"{self.ns_addr}:{p}={LOOPBACK}:{p}" for p in admins
        ]
        for side, prefix, specs in (("root", [], outside), ("netns", self.exec_prefix, inside)):
            process = ManagedProcess(
                name=f"chaos forwarder ({side} side of {self.name})",
                argv=[*prefix, sys.executable, "-m", "devstack.chaos", "forward", *specs],
                log_path=self.root / f"forward-{self.name}-{side}.log",
                marker=f"forward {specs[0]}",
            )
            process.start()
            self.forwarders.append(process)
            process.wait_ready(
                lambda p=process: FORWARDING in p.log_tail(5),  # type: ignore[misc]
                timeout=15.0,
            )

    def start_daemon(self, node: DaemonNode, env: Mapping[str, str] | None = None) -> None:
        """Start `node`'s `hakafka run` inside the namespace (a new process each time)."""
        node.process = ManagedProcess(
            name=f"hakafka daemon {node.name} (netns {self.name})",
            argv=[
                *self.exec_prefix,
                sys.executable,
                "-m",
                "hakafka.cli",
                "run",
                "--config",
                str(node.config_path),
            ],
            log_path=node.log_path,
            marker=str(node.config_path),
            env={"ARROW_DEFAULT_MEMORY_POOL": "jemalloc", **(env or {})},
        )
        node.process.start()

    def cut(self) -> None:
        """Take the veth link down: the namespace is cut off from everything outside it."""
        _ip("link", "set", self.veth_root, "down")

    def heal(self) -> None:
        _ip("link", "set", self.veth_root, "up")

    def delete(self) -> None:
        """Stop the forwarders by PID and delete the namespace (and with it the veth pair)."""
        for process in self.forwarders:
            process.stop()
        self.forwarders = []
        if self._created:
            with contextlib.suppress(DevstackError):
                _ip("netns", "delete", self.name)
            with contextlib.suppress(DevstackError):
                _ip("link", "delete", self.veth_root)
            self._created = False


FORWARDING = "forwarding:"


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)


def _serve(listener: socket.socket, target: tuple[str, int]) -> None:
    while True:
        client, _ = listener.accept()
        try:
            upstream = socket.create_connection(target, timeout=5.0)
        except OSError:
            client.close()
            continue
        upstream.settimeout(None)
        for a, b in ((client, upstream), (upstream, client)):
            threading.Thread(target=_pump, args=(a, b), daemon=True).start()


def _address(text: str) -> tuple[str, int]:
    host, port = text.rsplit(":", 1)
    return host, int(port)


def forward_main(specs: Iterable[str]) -> None:
    """Forward TCP for each `listen_host:port=target_host:port` until killed."""
    threads = []
    for spec in specs:
        listen, target = spec.split("=", 1)
        listener = socket.create_server(_address(listen), reuse_port=False)
        threads.append(
            threading.Thread(target=_serve, args=(listener, _address(target)), daemon=True)
        )
    for thread in threads:
        thread.start()
    print(f"{FORWARDING} {' '.join(specs)}", flush=True)
    while True:
        time.sleep(3600)


# -- liveness: health is data moving ----------------------------------------------------------


@dataclass(frozen=True)
class LivenessSample:
    """One look at one shard: seconds since it last made progress (its leader's checkpoint
    advanced, or it had nothing to do: lag 0 and an empty buffer), and whether every live
    node serving it answered `/ready` 200."""

    at: float  # time.monotonic()
    shard: int
    stalled: float
    ready: bool


class LivenessMonitor:
    """Samples every shard about once a second from the nodes' `/status` and `/ready`
    (thread `chaos-liveness`), so that the run can check that no shard is stuck while its
    nodes say they are ready, and how long each kind of fault kept the shards still."""

    def __init__(
        self, cluster: LocalCluster, shards: Callable[[], Sequence[int]], interval: float = 1.0
    ) -> None:
        self._cluster, self._shards, self._interval = cluster, shards, interval
        self.samples: list[LivenessSample] = []
        self._checkpoints: dict[int, int] = {}
        self._progress: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-liveness", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self._sample(time.monotonic())
            except Exception as exc:  # a sample is best effort; the run goes on
                print(f"chaos: liveness sample failed: {exc!r}", flush=True)

    def _sample(self, now: float) -> None:
        views: dict[str, dict[str, Any]] = {}
        ready: dict[str, bool] = {}
        for name, node in self._cluster.nodes.items():
            if node.process is None or not node.alive():
                continue
            try:
                views[name] = node.status()
                ready[name] = node.get("/ready", timeout=3.0)[0] == 200
            except Exception:
                ready[name] = False  # frozen or not answering: not ready
        for shard in self._shards():
            checkpoint, idle = None, False
            for view in views.values():
                for entry in view.get("shards", []):
                    if entry.get("shard") != shard or entry.get("role") != "leader":
                        continue
                    pipelines = entry.get("pipelines", [])
                    checkpoint = sum(sum(p["checkpoint"].values()) for p in pipelines)
                    idle = bool(pipelines) and all(
                        not any(p["lag"].values()) and not p["buffer_rows"] for p in pipelines
                    )
            self._progress.setdefault(shard, now)
            if idle or (checkpoint is not None and checkpoint > self._checkpoints.get(shard, -1)):
                self._progress[shard] = now
            if checkpoint is not None:
                self._checkpoints[shard] = max(checkpoint, self._checkpoints.get(shard, -1))
            serving = [
                n
                for n, node in self._cluster.nodes.items()
                if n in ready and shard in _config_shards(node.config_path)
            ]
            self.samples.append(
                LivenessSample(
                    now,
                    shard,
                    now - self._progress[shard],
                    bool(serving) and all(ready[n] for n in serving),
                )
            )

    def ready_while_stuck(self, bound: float, persist: int = 1) -> list[LivenessSample]:
        """Samples of a shard without progress for longer than `bound` while every node
        serving it said it was ready: the lie this run must never see. With `persist`, only
        runs of at least that many such samples in a row for one shard (about a second
        apart): at a leadership change the stuck leader is a follower, ready, a moment before
        its successor's new term carries the shard's stall, and two probes a second apart
        can both fall in that moment."""
        found: list[LivenessSample] = []
        for shard in sorted({s.shard for s in self.samples}):
            run: list[LivenessSample] = []
            for sample in sorted((s for s in self.samples if s.shard == shard), key=lambda s: s.at):
                if sample.stalled > bound and sample.ready:
                    run.append(sample)
                    continue
                found += run if len(run) >= persist else []
                run = []
            found += run if len(run) >= persist else []
        return found

    def progress_after(self, at: float) -> float | None:
        """Seconds from `at` until every shard that existed then had made progress again
        (None: not seen)."""
        waits = []
        for shard in {s.shard for s in self.samples if s.at <= at}:
            later = [s for s in self.samples if s.shard == shard and s.at >= at]
            first = next((s for s in later if s.stalled <= s.at - at), None)
            if first is None:
                return None
            waits.append(max(0.0, first.at - first.stalled - at))
        return max(waits, default=None)


def liveness_summary(
    faults: Sequence[Fault], began: float, monitor: LivenessMonitor, bounds: Sequence[float]
) -> str:
    """Per fault kind, the longest time from a fault's end until every shard progressed
    again, and for each of `bounds` the samples of a shard stuck past it while its nodes
    said ready."""
    longest: dict[str, float | None] = {}
    for fault in faults:
        if not fault.outcome.startswith("applied"):
            continue
        took = monitor.progress_after(began + fault.at + fault.seconds)
        before = longest.get(fault.kind, 0.0)
        longest[fault.kind] = None if took is None or before is None else max(before, took)
    kinds = ", ".join(
        f"{kind} {'never' if s is None else f'{s:.1f}s'}" for kind, s in sorted(longest.items())
    )
    counts = []
    for bound in bounds:
        lies = monitor.ready_while_stuck(bound)
        worst = max((s.stalled for s in lies), default=None)
        counts.append(
            f"{len(lies)} with a shard stuck > {bound:g} s while its nodes said ready"
            + ("" if worst is None else f" (longest {worst:.1f} s)")
        )
    return (
        f"liveness: longest fault end -> every shard progressing: {kinds or 'no faults'}; "
        f"{len(monitor.samples)} samples, " + ", ".join(counts)
    )


# -- the driver -------------------------------------------------------------------------------


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


def mark_start(log_path: Path, node: str) -> None:
    """Append a `NODE_STARTING` line to a daemon's log (no process of it may be running: the
    previous one was reaped, so no line of its own can interleave)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    line = {"event": NODE_STARTING, "level": "info", "node": node, "timestamp": _iso_now()}
    with open(log_path, "a", encoding="utf-8") as f:
        f.write(json.dumps(line) + "\n")


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
        marking the restart in its log (`NODE_STARTING`)."""
        node = self.cluster.nodes[name]
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
        )
        self.began = time.monotonic()
        """When the driver was made (time.monotonic()); each `Fault.at` counts from it."""
        self._deck: list[str] = []
        self._actions: dict[str, Callable[[], tuple[str, str]]] = {
            "kill_leader": self._kill_leader,
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
            if shard in _config_shards(node.config_path)
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
            if n != leader and shard in _config_shards(d.config_path) and n in t.zk_proxies
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
        stays up (no second CONNECTED comes to re-check the suspended term)."""
        t = self.targets
        shard, name, _node = self._leader()
        if name not in t.zk_proxies:
            raise _Skip(f"{name}, the leader of shard {shard}, has no ZooKeeper proxy")
        stall = t.request_timeout + 0.3
        proxy = t.zk_proxies[name]
        proxy.stall_next_connection(stall)
        proxy.cut()
        time.sleep(stall + 1.0)
        return f"{name} (leader of shard {shard})", f"applied: replies held {stall:.1f}s"

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


def _config_shards(config_path: Path) -> list[int]:
    """The `shards = [...]` of a generated node config."""
    shards = tomllib.loads(config_path.read_text())["shards"]
    return [int(s) for s in shards]


if __name__ == "__main__":
    if sys.argv[1:2] != ["forward"] or len(sys.argv) < 3:
        sys.exit("usage: python -m devstack.chaos forward LHOST:LPORT=THOST:TPORT ...")
    forward_main(sys.argv[2:])
