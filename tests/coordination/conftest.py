"""Fixtures and helpers for the coordination tests: coordinators against the real 3-member
ensemble, candidate processes, the one-leader watcher that checks "never two leaders at once"
continuously while a test runs, and the leadership log that checks it again afterwards."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

import pytest
from kazoo.client import KazooClient
from kazoo.recipe.watchers import DataWatch

from devstack.zookeeper import ZooKeeperEnsemble
from hakafka.coordination import (
    BecameLeader,
    Coordinator,
    FencedError,
    LeadershipEvent,
    LostLeadership,
    NodeInfo,
    Resumed,
    Suspended,
    ZkConfig,
    paths,
)

CANDIDATE = Path(__file__).with_name("coord_candidate.py")
SESSION_TIMEOUT_S = 2.0


@dataclass
class LeadershipLog:
    """Every node's leadership intervals, from the times the nodes report for their own
    state changes; `assert_one_leader` fails if two nodes' intervals overlap (checked after
    the fact; `OneLeaderWatcher` checks while the test runs)."""

    events: list[tuple[float, str, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, node: str, kind: str, at: float) -> None:
        with self.lock:
            self.events.append((at, node, kind))

    def callback(self, node: str) -> Callable[[LeadershipEvent], None]:
        def on_change(event: LeadershipEvent) -> None:
            if isinstance(event, (BecameLeader, Resumed)):
                self.record(node, "start", event.at)
            elif isinstance(event, (LostLeadership, Suspended)):
                self.record(node, "end", event.at)

        return on_change

    def feed(self, node: str, events: list[dict[str, Any]]) -> None:
        """Record a candidate process's reported leadership changes (its JSON events)."""
        for event in events:
            if event["event"] in ("became_leader", "resumed"):
                self.record(node, "start", event["at"])
            elif event["event"] in ("lost", "suspended"):
                self.record(node, "end", event["at"])

    def intervals(self, until: float | None = None) -> list[tuple[float, float, str]]:
        end_of_time = time.time() if until is None else until
        opened: dict[str, float] = {}
        spans: list[tuple[float, float, str]] = []
        with self.lock:
            events = sorted(self.events)
        for at, node, kind in events:
            if kind == "start":
                opened.setdefault(node, at)
            elif node in opened:
                spans.append((opened.pop(node), at, node))
        spans += [(start, end_of_time, node) for node, start in opened.items()]
        return sorted(spans)

    def leaders(self) -> list[str]:
        return [node for _, _, node in self.intervals()]

    def assert_one_leader(self) -> None:
        latest_end, latest = 0.0, ""
        for start, end, node in self.intervals():
            assert start >= latest_end, (
                f"{latest} led until {latest_end:.3f} and {node} from {start:.3f}: overlap"
            )
            if end > latest_end:
                latest_end, latest = end, node


SAMPLE_INTERVAL_S = 0.002
REPORT_GRACE_S = 1.0
"""How long a candidate process's report (a pipe away) may lag behind its state change."""


class _HasToken(Protocol):
    @property
    def token(self) -> int: ...


class LeadershipLike(Protocol):
    """What the watcher samples of an in-process candidate: a `Leadership`."""

    @property
    def shard(self) -> int: ...

    def fenced(self) -> _HasToken: ...


class ProcessLike(Protocol):
    """What the watcher reads of a candidate process: a `CandidateProcess`."""

    @property
    def node(self) -> str: ...

    @property
    def shard(self) -> int: ...

    @property
    def events(self) -> list[dict[str, Any]]: ...

    def signal(self, sig: signal.Signals) -> None: ...

    def alive(self) -> bool: ...


def clock(at: float) -> str:
    """`at` (Unix time) as local HH:MM:SS.mmm."""
    ms = round(at * 1000)
    return time.strftime("%H:%M:%S", time.localtime(ms // 1000)) + f".{ms % 1000:03d}"


@dataclass(frozen=True)
class DoubleLeader:
    """Two candidates of one shard leading at once, from `at` (Unix time)."""

    shard: int
    first: str
    second: str
    at: float
    seen: str

    def __str__(self) -> str:
        return (
            f"shard {self.shard}: {self.first} and {self.second} both led at {clock(self.at)} "
            f"(unix {self.at:.3f}; {self.seen})"
        )


@dataclass
class _Span:
    """One leadership term of one candidate: [start, end), end None while it lasts."""

    name: str
    start: float
    token: int | None
    end: float | None = None
    reported: bool = False
    """True for a process's self-reported term: its end may still be on its way to us."""


@dataclass
class _Sampled:
    name: str
    leadership: LeadershipLike
    spans: list[_Span] = field(default_factory=list)


@dataclass
class _Reported:
    proc: ProcessLike
    read: int = 0
    marks: list[tuple[float, int, str, int | None]] = field(default_factory=list)
    """(at, order, kind, token): the process's reports and what the test did to it."""
    spans: list[_Span] = field(default_factory=list)


class OneLeaderWatcher:
    """Checks "never two leaders of a shard at once" continuously while a test runs.

    A background thread wakes every `interval_s` and
    - samples every in-process candidate (`add_leadership`): it leads while `fenced()` works,
      i.e. while it passes its own fencing check (`Leadership._leads_with`: state LEADER with
      its token). A SUSPENDED leader does not count: it has stopped its side effects and its
      fenced state refuses every call locally;
    - reads the event streams of candidate processes (`add_process`) as they arrive and turns
      them into leadership terms: from `became_leader`/`resumed` to `lost`/`suspended`, cut
      short by a SIGKILL or SIGSTOP the test sends through `signal()`. A thawed process leads
      again only if no successor was elected meanwhile (else it is a fenced zombie, see
      `_reported_terms`).

    Every instant at which two candidates of the same shard lead is recorded (`found`) the
    moment it is certain: at once between sampled candidates, and `grace_s` after it began
    when a process is involved (its report of having stopped may still be in the pipe).
    `assert_never_two()` fails naming the candidates and the time.
    """

    def __init__(
        self, interval_s: float = SAMPLE_INTERVAL_S, grace_s: float = REPORT_GRACE_S
    ) -> None:
        self.interval_s = interval_s
        self.grace_s = grace_s
        self.found: list[DoubleLeader] = []
        self.samples = 0
        self.longest_gap_s = 0.0
        self._sampled: dict[int, list[_Sampled]] = {}
        self._reported: dict[int, list[_Reported]] = {}
        self._seen: set[tuple[int, str, str, float]] = set()
        self._changed = False
        self._unsettled = False
        self._order = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="one-leader-watcher", daemon=True)

    # -- what the test registers ------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def add_leadership(self, name: str, leadership: LeadershipLike) -> None:
        """Sample `leadership` (an in-process candidate called `name`) from now on."""
        with self._lock:
            self._sampled.setdefault(leadership.shard, []).append(_Sampled(name, leadership))

    def add_process(self, proc: ProcessLike) -> None:
        """Follow `proc`'s leadership reports (all of them, also those already printed)."""
        with self._lock:
            self._reported.setdefault(proc.shard, []).append(_Reported(proc))

    def signal(self, proc: ProcessLike, sig: signal.Signals) -> float:
        """Send `sig` to `proc` and note it: a SIGKILLed or SIGSTOPped process acts no more.
        Returns the time noted (after sending; before sending for SIGCONT)."""
        if sig == signal.SIGCONT:
            at = time.time()
            self._mark(proc, at, "thaw")
            proc.signal(sig)
            return at
        proc.signal(sig)
        at = time.time()
        if sig in (signal.SIGKILL, signal.SIGSTOP):
            self._mark(proc, at, "kill" if sig == signal.SIGKILL else "freeze")
        return at

    def _mark(self, proc: ProcessLike, at: float, kind: str, token: int | None = None) -> None:
        with self._lock:
            for followed in self._reported.get(proc.shard, []):
                if followed.proc is proc:
                    self._order += 1
                    followed.marks.append((at, self._order, kind, token))
                    self._changed = True
                    return
        raise ValueError(f"{proc.node} is not followed: add_process() it first")

    # -- the thread -------------------------------------------------------------------------

    def _run(self) -> None:
        last = time.monotonic()
        try:
            while not self._stop.wait(self.interval_s):
                self._tick()
                self.samples += 1
                now = time.monotonic()
                self.longest_gap_s = max(self.longest_gap_s, now - last)
                last = now
        except BaseException as exc:  # reported by assert_never_two, never swallowed
            self._error = exc

    def _tick(self) -> None:
        with self._lock:
            now = time.time()
            for candidates in self._sampled.values():
                for candidate in candidates:
                    self._sample(candidate, now)
            for processes in self._reported.values():
                for followed in processes:
                    self._read(followed, now)
            self._check(now)

    def _sample(self, candidate: _Sampled, now: float) -> None:
        try:
            token: int | None = candidate.leadership.fenced().token
        except FencedError:
            token = None
        current = candidate.spans[-1] if candidate.spans else None
        if current is not None and current.end is None and token != current.token:
            current.end = now  # stopped leading, or resigned and re-elected between samples
            self._changed = True
            current = None
        if token is not None and (current is None or current.end is not None):
            candidate.spans.append(_Span(candidate.name, now, token))
            self._changed = True

    def _read(self, followed: _Reported, now: float) -> None:
        proc = followed.proc
        events = proc.events[followed.read :]  # appended by the process's reader thread
        followed.read += len(events)
        for event in events:
            kind = {
                "became_leader": "start",
                "resumed": "start",
                "lost": "end",
                "suspended": "end",
            }.get(event["event"])
            if kind is not None:
                self._order += 1
                followed.marks.append((event["at"], self._order, kind, event.get("token")))
                self._changed = True
        gone = any(kind in ("kill", "exit") for _, _, kind, _ in followed.marks)
        if not gone and not proc.alive():
            self._order += 1
            followed.marks.append((now, self._order, "exit", None))
            self._changed = True

    def _reported_terms(self, shard: int, followed: _Reported) -> list[_Span]:
        """The terms in which the process could act as leader, from its sorted marks."""
        spans: list[_Span] = []
        believes, frozen, gone = False, False, False
        token: int | None = None
        current: _Span | None = None

        def close(at: float) -> None:
            nonlocal current
            if current is not None:
                current.end = at
                current = None

        for at, _, kind, marked in sorted(followed.marks):
            if kind == "start":
                believes, token = True, marked
                if current is None and not frozen and not gone:
                    current = _Span(followed.proc.node, at, token, reported=True)
                    spans.append(current)
            elif kind == "end":
                believes = False
                close(at)
            elif kind == "freeze":
                frozen = True
                close(at)
            elif kind in ("kill", "exit"):
                gone = True
                close(at)
            elif kind == "thaw":
                frozen = False
                # A frozen process ran nothing, so it could not act. Thawed, it still
                # believes it leads (and may pass the local check) until kazoo notices the
                # dropped session; but if a successor was elected meanwhile, the epoch
                # version moved past its token, so the epoch `check` inside every fenced
                # multi-op refuses each write it tries: a zombie, not a leader (the SIGSTOP
                # test asserts the FencedError). Only a thawed leader nobody superseded can
                # still pass its fencing check, so only it leads again.
                if believes and not gone and not self._superseded(shard, followed, token, at):
                    current = _Span(followed.proc.node, at, token, reported=True)
                    spans.append(current)
        return spans

    def _superseded(self, shard: int, followed: _Reported, token: int | None, at: float) -> bool:
        """True if another candidate of `shard` began leading with a newer token by `at`."""
        if token is None:
            return False
        starts = [(s.start, s.token) for c in self._sampled.get(shard, []) for s in c.spans]
        starts += [
            (mark_at, marked)
            for other in self._reported.get(shard, [])
            if other is not followed
            for mark_at, _, kind, marked in other.marks
            if kind == "start"
        ]
        return any(newer is not None and newer > token and begin <= at for begin, newer in starts)

    def _check(self, now: float) -> None:
        if not self._changed and not self._unsettled:
            return
        self._changed, self._unsettled = False, False
        for shard in sorted(set(self._sampled) | set(self._reported)):
            for followed in self._reported.get(shard, []):
                followed.spans = self._reported_terms(shard, followed)
            for first, second, at in self._overlaps(shard):
                if first.reported or second.reported:
                    if now - at < self.grace_s:
                        # A report that ends one of the terms earlier may be on its way.
                        self._unsettled = True
                        continue
                    seen = "from the leadership events the candidates reported"
                else:
                    seen = "both sampled passing their fencing check"
                names = sorted((first.name, second.name))
                key = (shard, names[0], names[1], at)
                if key not in self._seen:
                    self._seen.add(key)
                    self.found.append(DoubleLeader(shard, names[0], names[1], at, seen))

    def _overlaps(self, shard: int) -> list[tuple[_Span, _Span, float]]:
        """Every pair of terms of different candidates of `shard` that overlap, with the
        instant the overlap began."""
        terms = [s for c in self._sampled.get(shard, []) for s in c.spans]
        terms += [s for p in self._reported.get(shard, []) for s in p.spans]
        found = []
        for i, first in enumerate(terms):
            for second in terms[i + 1 :]:
                if first.name == second.name:
                    continue
                begin = max(first.start, second.start)
                end = min(math.inf if s.end is None else s.end for s in (first, second))
                if begin < end:
                    found.append((first, second, begin))
        return found

    # -- results ----------------------------------------------------------------------------

    def assert_never_two(self) -> None:
        """Fail if two candidates of one shard ever led at once (so far), naming them and
        when. Waits at most `grace_s` for overlaps whose reports may still be on their way."""
        deadline = time.monotonic() + self.grace_s + 1.0
        while True:
            self._tick()
            with self._lock:
                unsettled = self._unsettled
            if not unsettled or time.monotonic() >= deadline:
                break
            time.sleep(self.interval_s)
        with self._lock:
            found = list(self.found)
        assert self._error is None, f"the one-leader watcher crashed: {self._error!r}"
        assert self.samples > 0, "the one-leader watcher's thread never sampled"
        assert not found, (
            f"{len(found)} times two leaders at once: "
            + "; ".join(str(f) for f in found[:10])
            + f" ({self.samples} samples, longest gap {self.longest_gap_s * 1000:.0f} ms)"
        )

    def close(self) -> None:
        """Stop the thread (waits at most 5 s)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5.0)
        assert not self._thread.is_alive(), "the one-leader watcher did not stop within 5 s"


def _candidate_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("coord_candidate", CANDIDATE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class LeaderWatcher:
    """A separate kazoo client that records every change of `shards/<s>/leader` it sees:
    (unix time, node or None, epoch or None). It shows what other clients see (and that
    epochs only grow); one znode cannot show two leaders: that is `OneLeaderWatcher`'s job."""

    def __init__(self, hosts: str, root: str, shard: int = 0) -> None:
        self.client = KazooClient(hosts=hosts, timeout=10.0)
        self.client.start(timeout=10)
        self.client.ensure_path(f"{root}{paths.shard(shard)}")
        self.seen: list[tuple[float, str | None, int | None]] = []
        DataWatch(self.client, f"{root}{paths.leader(shard)}", self._changed)

    def _changed(self, data: bytes | None, _stat: Any) -> None:
        if data is None:
            self.seen.append((time.time(), None, None))
        else:
            value = json.loads(data)
            self.seen.append((time.time(), value["node"], value["epoch"]))

    def current(self) -> str | None:
        return self.seen[-1][1] if self.seen else None

    def assert_epochs_increase(self) -> None:
        epochs = [epoch for _, _, epoch in self.seen if epoch is not None]
        assert epochs == sorted(set(epochs)), f"leader epochs not strictly increasing: {epochs}"

    def close(self) -> None:
        self.client.stop()
        self.client.close()


@pytest.fixture
def leader_watcher(zookeeper_ensemble: ZooKeeperEnsemble, zk_root: str) -> Iterator[LeaderWatcher]:
    watcher = LeaderWatcher(zookeeper_ensemble.hosts, zk_root)
    try:
        yield watcher
    finally:
        watcher.close()


class CoordinatorFactory:
    """Makes started coordinators for this test's root; closes them all at teardown."""

    def __init__(self, hosts: str, root: str) -> None:
        self.hosts = hosts
        self.root = root
        self.made: list[Coordinator] = []

    def config(self, **overrides: Any) -> ZkConfig:
        values: dict[str, Any] = {
            "hosts": self.hosts,
            "root": self.root,
            "session_timeout_s": SESSION_TIMEOUT_S,
            "request_timeout_s": 2.0,
            "connect_timeout_s": 10.0,
        }
        values.update(overrides)
        return ZkConfig(**values)

    def __call__(self, node: str, *, register: bool = True, **overrides: Any) -> Coordinator:
        endpoints = NodeInfo(
            host="127.0.0.1",
            http=f"http://127.0.0.1:1/{node}",
            flight="",
            pid=os.getpid(),
            version="test",
        )
        coordinator = Coordinator(self.config(**overrides), node, endpoints)
        coordinator.start()
        self.made.append(coordinator)
        if register:
            coordinator.register()
        return coordinator

    def close(self) -> None:
        for coordinator in reversed(self.made):
            coordinator.close()


@pytest.fixture
def coordinators(
    zookeeper_ensemble: ZooKeeperEnsemble, zk_root: str
) -> Iterator[CoordinatorFactory]:
    factory = CoordinatorFactory(zookeeper_ensemble.hosts, zk_root)
    try:
        yield factory
    finally:
        factory.close()


@pytest.fixture
def candidates(zookeeper_ensemble: ZooKeeperEnsemble, zk_root: str) -> Iterator[Callable[..., Any]]:
    """start(node, shard=0, session_timeout=SESSION_TIMEOUT_S): a started coord_candidate.py
    process (CandidateProcess)."""
    started: list[Any] = []
    process_class = _candidate_module().CandidateProcess

    def start(node: str, shard: int = 0, session_timeout: float = SESSION_TIMEOUT_S) -> Any:
        proc = process_class(zookeeper_ensemble.hosts, zk_root, node, shard, session_timeout)
        started.append(proc)
        proc.wait_event("ready", 20)
        return proc

    try:
        yield start
    finally:
        for proc in started:
            proc.stop()


@pytest.fixture
def leadership_log() -> LeadershipLog:
    return LeadershipLog()


@pytest.fixture
def one_leader_watchers() -> Iterator[Callable[..., OneLeaderWatcher]]:
    """make(**options): a started `OneLeaderWatcher`, stopped at teardown (not asserted:
    for tests of the watcher itself)."""
    made: list[OneLeaderWatcher] = []

    def make(**options: float) -> OneLeaderWatcher:
        watcher = OneLeaderWatcher(**options)
        made.append(watcher)
        watcher.start()
        return watcher

    try:
        yield make
    finally:
        for watcher in made:
            watcher.close()


@pytest.fixture
def one_leader(
    coordinators: CoordinatorFactory, candidates: Callable[..., Any]
) -> Iterator[OneLeaderWatcher]:
    """A started `OneLeaderWatcher`; at teardown it fails the test if two candidates ever
    led one shard at once. It depends on `coordinators` and `candidates` so that it stops
    before they close their coordinators and kill their processes."""
    watcher = OneLeaderWatcher()
    watcher.start()
    try:
        yield watcher
    finally:
        watcher.close()
    watcher.assert_never_two()
