"""End-of-run checks of a chaos run over the daemons' JSON logs and WALs.

`commit_violations` reads each daemon's log for `fenced.checkpoint_committed` and says
whether two nodes ever committed for the same shard and epoch or a shard's epochs went
backwards; `verify_wals` runs `python -m wal verify` on every WAL directory.
`election_timings` reads, for every `leader.elected` of every daemon, how long it took until
that node's `leader.consuming` for the shard (or why it never got there); `consuming_summary`
is the distribution the run prints and `too_slow` what fails the long run. `flush_report`
reads every committed block's task count and every re-flush with the node that wrote the
intent it followed (`fenced.pending_written`), so the run can show blocks of several tasks
and re-flushes across nodes of different `rows_per_task`, each in the writer's task count.

WAL damage, as these checks define it: a torn tail (a record cut short by SIGKILL) is
expected and repaired when the log is opened, so it is reported but not damage; a corrupt
record (CRC mismatch, impossible length, missing segment) and any quarantined `*.corrupt`
file are damage.
"""

from __future__ import annotations

import json
import math
import re
import statistics
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from devstack.chaos.watcher import LeaderObservation
from devstack.cluster import LocalCluster
from hakafka.config import load_config


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


def event_time(timestamp: str) -> float:
    """A log event's `timestamp` (ISO 8601, UTC) as Unix time."""
    return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()


def _iso_now() -> str:
    """Now, as the daemons' structlog `TimeStamper(fmt="iso", utc=True)` writes it."""
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def read_commits(logs: Mapping[str, LogFiles]) -> list[Commit]:
    """Every checkpoint commit of every node (node name -> its log files), in time order."""
    commits = [
        Commit(
            event_time(e["timestamp"]), node, int(e["shard"]), str(e["pipeline"]), int(e["epoch"])
        )
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
            (event_time(e["timestamp"]), node, e)
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
            for t in _node_timings(node, sorted(events, key=lambda e: event_time(e["timestamp"])))
        ]
    return sorted(timings, key=lambda t: (t.elected_at, t.node, t.shard))


def _first_checkpoints(events: Iterable[dict[str, Any]]) -> dict[tuple[int, int], float]:
    """(shard, epoch) -> time of that term's first checkpoint commit, from one node's log."""
    firsts: dict[tuple[int, int], float] = {}
    for e in events:
        if isinstance(e.get("timestamp"), str) and "shard" in e and "epoch" in e:
            key, at = (int(e["shard"]), int(e["epoch"])), event_time(e["timestamp"])
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
                event_time(elected["timestamp"]),
                None if consuming is None else event_time(consuming["timestamp"]),
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


def mark_start(log_path: Path, node: str) -> None:
    """Append a `NODE_STARTING` line to a daemon's log (no process of it may be running: the
    previous one was reaped, so no line of its own can interleave)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    line = {"event": NODE_STARTING, "level": "info", "node": node, "timestamp": _iso_now()}
    with open(log_path, "a", encoding="utf-8") as f:
        f.write(json.dumps(line) + "\n")
