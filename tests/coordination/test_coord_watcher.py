"""The one-leader watcher itself (conftest.py): it must flag two leaders at once, live, and
must not flag a hand-over, another shard's leader, a killed leader or a fenced zombie.
Plain fake candidates; no ZooKeeper."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from devstack.process import wait_until
from hakafka.coordination import FencedError

STEP_S = 0.01  # between fake events, so their timestamps are ordered


@dataclass
class AlwaysLeader:
    """An in-process candidate that believes it leads `shard` with `token`, forever."""

    shard: int = 0
    token: int = 1

    def fenced(self) -> AlwaysLeader:
        return self


@dataclass
class Switchable:
    """An in-process candidate that leads while `leading` is set."""

    leading: bool = False
    shard: int = 0
    token: int = 1

    def fenced(self) -> Switchable:
        if not self.leading:
            raise FencedError("not the leader")
        return self


@dataclass
class FakeProcess:
    """A candidate process: its reported events, and the signals it got."""

    node: str
    shard: int = 0
    events: list[dict[str, Any]] = field(default_factory=list)
    signals: list[signal.Signals] = field(default_factory=list)

    def report(self, event: str, token: int | None = None) -> None:
        time.sleep(STEP_S)
        self.events.append({"event": event, "at": time.time(), "token": token})
        time.sleep(STEP_S)

    def signal(self, sig: signal.Signals) -> None:
        self.signals.append(sig)

    def alive(self) -> bool:
        return signal.SIGKILL not in self.signals


def wait_samples(watcher: Any, count: int) -> None:
    target = watcher.samples + count
    wait_until(lambda: watcher.samples >= target, timeout=5, what=f"{count} more samples")


def test_two_in_process_leaders_are_flagged_while_the_test_runs(
    one_leader_watchers: Callable[..., Any],
) -> None:
    watcher = one_leader_watchers()
    before = time.time()
    watcher.add_leadership("n1", AlwaysLeader(token=1))
    watcher.add_leadership("n2", AlwaysLeader(token=2))
    # Flagged by the thread, before anyone asks.
    wait_until(lambda: bool(watcher.found), timeout=5, what="the watcher flagging n1 and n2")
    found = watcher.found[0]
    assert (found.shard, found.first, found.second) == (0, "n1", "n2")
    assert before <= found.at <= time.time()
    with pytest.raises(AssertionError, match=r"shard 0: n1 and n2 both led at \d\d:\d\d:\d\d\.\d"):
        watcher.assert_never_two()


def test_a_hand_over_and_another_shards_leader_are_not_flagged(
    one_leader_watchers: Callable[..., Any],
) -> None:
    watcher = one_leader_watchers()
    first, second = Switchable(leading=True), Switchable(token=2)
    watcher.add_leadership("n1", first)
    watcher.add_leadership("n2", second)
    watcher.add_leadership("n3", AlwaysLeader(shard=1))
    wait_samples(watcher, 20)
    first.leading = False
    wait_samples(watcher, 20)
    second.leading = True
    wait_samples(watcher, 20)
    watcher.assert_never_two()
    assert watcher.found == []


def watched_pair(one_leader_watchers: Callable[..., Any]) -> tuple[Any, FakeProcess, FakeProcess]:
    """A watcher of two candidate processes, p1 already leading."""
    watcher = one_leader_watchers(grace_s=0.2)
    p1, p2 = FakeProcess("p1"), FakeProcess("p2")
    watcher.add_process(p1)
    watcher.add_process(p2)
    p1.report("became_leader", token=1)
    return watcher, p1, p2


def test_two_processes_reporting_leadership_at_once_are_flagged(
    one_leader_watchers: Callable[..., Any],
) -> None:
    watcher, _p1, p2 = watched_pair(one_leader_watchers)
    p2.report("became_leader", token=2)  # p1 never reported losing it
    wait_until(lambda: bool(watcher.found), timeout=5, what="the watcher flagging p1 and p2")
    found = watcher.found[0]
    assert (found.first, found.second, found.at) == ("p1", "p2", p2.events[0]["at"])
    with pytest.raises(AssertionError, match="shard 0: p1 and p2 both led"):
        watcher.assert_never_two()


def test_processes_handing_over_killed_or_fenced_are_not_flagged(
    one_leader_watchers: Callable[..., Any],
) -> None:
    watcher = one_leader_watchers(grace_s=0.2)
    p1, p2, p3, p4 = (FakeProcess(f"p{i}") for i in range(1, 5))
    for proc in (p1, p2, p3, p4):
        watcher.add_process(proc)
    p1.report("became_leader", token=1)
    p1.report("lost")
    p2.report("became_leader", token=2)
    watcher.signal(p2, signal.SIGKILL)
    p3.report("became_leader", token=3)
    # p3 frozen, p4 elected meanwhile: thawed p3 believes it leads until it notices, but
    # its token is stale, so it cannot pass the fencing check.
    watcher.signal(p3, signal.SIGSTOP)
    p4.report("became_leader", token=4)
    watcher.signal(p3, signal.SIGCONT)
    p3.report("suspended")
    p3.report("lost")
    watcher.assert_never_two()
    assert p3.signals == [signal.SIGSTOP, signal.SIGCONT]


def test_a_thawed_leader_nobody_superseded_still_counts(
    one_leader_watchers: Callable[..., Any],
) -> None:
    watcher, p1, p2 = watched_pair(one_leader_watchers)
    watcher.signal(p1, signal.SIGSTOP)
    thawed = watcher.signal(p1, signal.SIGCONT)
    p2.report("became_leader", token=2)  # while p1 still leads: a real double leader
    with pytest.raises(AssertionError, match="shard 0: p1 and p2 both led"):
        watcher.assert_never_two()
    assert watcher.found[0].at > thawed
