"""Process-level faults against the real 3-member ZooKeeper ensemble: kill -9 of the leader
process, a leader frozen with SIGSTOP past its session timeout, and the crash of the
ensemble's own leader member."""

from __future__ import annotations

import json
import signal
import time
from typing import Any

import pytest
from kazoo.client import KazooClient

from devstack.process import wait_until
from hakafka.coordination import LeadershipState, paths

SESSION_TIMEOUT_S = 2.0


def started_leader(procs: list[Any]) -> Any:
    """The process that reported became_leader (waiting up to 10 s for one)."""
    found: list[Any] = []

    def one() -> bool:
        found[:] = [p for p in procs if any(e["event"] == "became_leader" for e in p.events)]
        return bool(found)

    wait_until(one, timeout=10, what="a first leader")
    return found[0]


def successor(alive: list[Any], since: float) -> tuple[Any, float]:
    """The one process that became leader after `since`, and when (waits for it)."""
    found: list[Any] = []

    def elected() -> bool:
        found[:] = [p for p in alive if p.became_after(since) is not None]
        return bool(found)

    wait_until(elected, timeout=SESSION_TIMEOUT_S + 5, what="a new leader", interval=0.01)
    assert len(found) == 1, f"several new leaders: {[p.node for p in found]}"
    became = found[0].became_after(since)
    assert became is not None
    return found[0], became


@pytest.mark.integration
def test_kill_9_of_the_leader_elects_a_new_one_within_session_timeout(
    candidates: Any, leader_watcher: Any, leadership_log: Any, one_leader: Any
) -> None:
    procs = [candidates(node) for node in ("n1", "n2", "n3")]
    for proc in procs:
        one_leader.add_process(proc)
    alive = list(procs)
    leader = started_leader(procs)
    assert leader.node == "n1"
    killed_at: dict[str, float] = {}
    for _ in range(2):
        killed = one_leader.signal(leader, signal.SIGKILL)
        killed_at[leader.node] = killed
        alive.remove(leader)
        leader, became = successor(alive, killed)
        took = became - killed
        assert took < SESSION_TIMEOUT_S + 1.0, f"new leader after {took:.2f} s"
    assert leader.node == "n3"
    one_leader.assert_never_two()
    for proc in procs:
        leadership_log.feed(proc.node, proc.events)
        if proc.node in killed_at:  # a killed leader led until the kill at the latest
            leadership_log.record(proc.node, "end", killed_at[proc.node])
    leadership_log.assert_one_leader()
    assert leadership_log.leaders() == ["n1", "n2", "n3"]
    wait_until(lambda: leader_watcher.current() == "n3", timeout=5, what="watcher seeing n3")
    leader_watcher.assert_epochs_increase()
    assert [node for _, node, _ in leader_watcher.seen if node] == ["n1", "n2", "n3"]


@pytest.mark.integration
def test_leader_frozen_past_its_session_is_fenced_after_resuming(
    candidates: Any, zookeeper_ensemble: Any, zk_root: str, one_leader: Any
) -> None:
    n1 = candidates("n1")
    n2 = candidates("n2")
    one_leader.add_process(n1)
    one_leader.add_process(n2)
    assert started_leader([n1, n2]) is n1
    n1.send("commit p t 0 10")
    assert n1.wait_event("commit", 10).get("ok") is True

    stopped = one_leader.signal(n1, signal.SIGSTOP)
    took_over = n2.wait_event("became_leader", SESSION_TIMEOUT_S + 5)
    assert took_over["at"] - stopped < SESSION_TIMEOUT_S + 1.0
    n2.send("commit p t 0 20")
    assert n2.wait_event("commit", 10)["checkpoint"] == {"t": {"0": 20}}

    # The zombie wakes up and tries to commit with the token it had: refused.
    n1.send("commit p t 0 999")
    one_leader.signal(n1, signal.SIGCONT)
    refused = n1.wait_event("commit", 15)
    assert refused.get("error") == "FencedError", refused
    assert "shard 0" in refused["message"]
    # (the lost event may come before or after the refused commit)
    wait_until(lambda: any(e["event"] == "lost" for e in n1.events), timeout=15, what="n1 lost")
    lost = next(e for e in n1.events if e["event"] == "lost")
    assert lost["reason"] in (
        "zookeeper session lost",
        "leadership lost while the connection was suspended",
    )

    raw = KazooClient(hosts=zookeeper_ensemble.hosts, timeout=10.0)
    raw.start(timeout=10)
    try:
        data, _ = raw.get(f"{zk_root}{paths.checkpoint(0, 'p')}")
        leader, _ = raw.get(f"{zk_root}{paths.leader(0)}")
    finally:
        raw.stop()
        raw.close()
    assert json.loads(data) == {"t": {"0": 20}}
    assert json.loads(leader)["node"] == "n2"
    # n1 stands again behind n2 and never claimed leadership back.
    assert [e for e in n1.events if e["event"] == "became_leader"][1:] == []
    # The thawed zombie believed it led until it noticed, but with a stale token (refused
    # above), so it never counted as a second leader.
    one_leader.assert_never_two()


@pytest.mark.integration
def test_crash_of_the_ensemble_leader_member_keeps_one_leader(
    coordinators: Any,
    zookeeper_ensemble: Any,
    leader_watcher: Any,
    leadership_log: Any,
    one_leader: Any,
) -> None:
    joined = {}
    for node in ("n1", "n2", "n3"):
        coordinator = coordinators(node, session_timeout_s=4.0)
        joined[node] = coordinator.join(0, on_change=leadership_log.callback(node))
        one_leader.add_leadership(node, joined[node])
    assert joined["n1"].wait_leader(10)
    zk_leader = zookeeper_ensemble.leader_id()
    assert zk_leader is not None
    try:
        zookeeper_ensemble.stop_member(zk_leader, sig=signal.SIGKILL)
        crashed = time.monotonic()

        def settled() -> bool:
            leading = [n for n, lead in joined.items() if lead.state is LeadershipState.LEADER]
            return len(leading) == 1 and all(c.connected for c in coordinators.made)

        zookeeper_ensemble.wait_settled(timeout=30)
        wait_until(settled, timeout=30, what="one leader after the ZooKeeper leader crashed")
        assert time.monotonic() - crashed < 30
        time.sleep(1.0)
        assert settled()
    finally:
        zookeeper_ensemble.start_member(zk_leader)
        zookeeper_ensemble.wait_settled(timeout=30)
    one_leader.assert_never_two()
    leadership_log.assert_one_leader()
    leader_watcher.assert_epochs_increase()
    leading = [n for n, lead in joined.items() if lead.state is LeadershipState.LEADER]
    info = coordinators.made[0].leader_of(0)
    assert info is not None and [info.node] == leading
