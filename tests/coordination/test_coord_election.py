"""Election, replacement flags and ops failover with in-process coordinators against the real
3-member ZooKeeper ensemble; a separate watcher records every change of the leader znode, and
the one-leader watcher samples every candidate throughout each test."""

from __future__ import annotations

import functools
import time
from typing import Any

import pytest
from kazoo.client import KazooClient

from devstack.process import wait_until
from hakafka.coordination import (
    Coordinator,
    FailoverRefused,
    FailoverRequested,
    Leadership,
    LeadershipEvent,
    LeadershipState,
    paths,
)

ELECT_TIMEOUT_S = 10.0


def stand(
    coordinators: Any,
    nodes: list[str],
    log: Any,
    one_leader: Any,
    *,
    resign_on_failover: bool = True,
) -> tuple[dict[str, Coordinator], dict[str, Leadership]]:
    """Start a coordinator per node and join shard 0, in this order (so sequences ascend);
    `one_leader` samples each one from its join on."""
    made: dict[str, Coordinator] = {}
    joined: dict[str, Leadership] = {}
    for node in nodes:
        coordinator = coordinators(node)

        record = log.callback(node)

        def on_change(event: LeadershipEvent, node: str = node, record: Any = record) -> None:
            record(event)
            if resign_on_failover and isinstance(event, FailoverRequested):
                joined[node].resign("failover requested")

        made[node] = coordinator
        joined[node] = coordinator.join(0, on_change=on_change)
        one_leader.add_leadership(node, joined[node])
        # Its first evaluation (standing or withdrawing) is done before the next node joins.
        coordinator.settle(ELECT_TIMEOUT_S)
    wait_until(
        lambda: made[nodes[-1]].leader_of(0) is not None, timeout=ELECT_TIMEOUT_S, what="a leader"
    )
    return made, joined


def leader(joined: dict[str, Leadership]) -> str:
    """The one node whose Leadership is LEADER (fails if none or several)."""
    leading = [n for n, lead in joined.items() if lead.state is LeadershipState.LEADER]
    assert len(leading) == 1, f"expected exactly one leader, got {leading}"
    return leading[0]


def sees_leader(coordinator: Coordinator, node: str) -> bool:
    info = coordinator.leader_of(0)
    return info is not None and info.node == node


def wait_new_leader(joined: dict[str, Leadership], old: str, timeout: float) -> str:
    found: list[str] = []

    def changed() -> bool:
        leading = [n for n, lead in joined.items() if lead.state is LeadershipState.LEADER]
        found[:] = [n for n in leading if n != old]
        return bool(found)

    wait_until(changed, timeout=timeout, what=f"a leader other than {old}", interval=0.002)
    return found[0]


@pytest.mark.integration
@pytest.mark.parametrize("count", [2, 3])
def test_one_leader_and_clean_resign_hands_over_within_500ms(
    leadership_log: Any, coordinators: Any, leader_watcher: Any, one_leader: Any, count: int
) -> None:
    log = leadership_log
    nodes = [f"n{i}" for i in range(1, count + 1)]
    made, joined = stand(coordinators, nodes, log, one_leader)
    assert leader(joined) == "n1"  # the lowest sequence
    for _ in range(4):
        old = leader(joined)
        started = time.monotonic()
        joined[old].resign("test")
        new = wait_new_leader(joined, old, 2.0)
        elapsed = time.monotonic() - started
        assert elapsed < 0.5, f"new leader {new} after {elapsed:.3f} s"
        # Another client's view catches up (ZooKeeper is only sequentially consistent).
        watcher_view = functools.partial(sees_leader, made[old], new)
        wait_until(watcher_view, timeout=2.0, what=f"{old} seeing {new} as leader")
    time.sleep(0.3)
    leader(joined)
    one_leader.assert_never_two()
    log.assert_one_leader()
    leader_watcher.assert_epochs_increase()
    assert len(log.intervals()) == 5
    assert {node for _, node, _ in leader_watcher.seen if node} <= set(nodes)


@pytest.mark.integration
def test_replacing_node_never_leads_and_leadership_moves_off_it(
    leadership_log: Any, coordinators: Any, leader_watcher: Any, one_leader: Any, zk_root: str
) -> None:
    log = leadership_log
    ops = coordinators("ops", register=False)
    ops.init_paths([0])
    ops.mark_replacing("n1", "disk swap", by="alice")
    # A candidate of n1 with the lowest sequence that did not withdraw (a slow or stuck n1).
    raw = KazooClient(hosts=coordinators.hosts, timeout=10.0)
    raw.start(timeout=10)
    try:
        stale = raw.create(
            f"{zk_root}{paths.candidate_prefix(0)}", b"n1", ephemeral=True, sequence=True
        )
        made, joined = stand(coordinators, ["n1", "n2", "n3"], log, one_leader)
        assert leader(joined) == "n2"
        election = f"{zk_root}{paths.election(0)}"
        # raw's ensemble member may not have applied n3's candidate yet (reads are not
        # linearizable): a sync first. A full run once saw 2 children here.
        raw.sync(election)
        children = sorted(raw.get_children(election))
        assert children[0] == stale.rsplit("/", 1)[1]
        assert len(children) == 3, "n1's own coordinator must not stand while flagged"

        replicas = {"n1": "ch1:8123", "n2": "ch2:8123", "n3": "ch3:8123"}
        assert ops.writable_replicas(0, replicas) == {"n2": "ch2:8123", "n3": "ch3:8123"}

        # Flagging the leader moves leadership at once; n1 stays out.
        started = time.monotonic()
        ops.mark_replacing("n2", "host retired", by="alice")
        assert wait_new_leader(joined, "n2", 3.0) == "n3"
        assert time.monotonic() - started < 2.0
        assert ops.writable_replicas(0, replicas) == {"n3": "ch3:8123"}
        assert set(ops.replacing()) == {"n1", "n2"}
        assert ops.replacing()["n2"].reason == "host retired"

        # Cleared: n2 stands again and takes over when n3 resigns; n1 still never leads.
        assert ops.clear_replacing("n2") is True
        wait_until(
            lambda: len(raw.get_children(f"{zk_root}{paths.election(0)}")) == 3,
            timeout=3.0,
            what="n2 standing again",
        )
        joined["n3"].resign("test")
        assert wait_new_leader(joined, "n3", 2.0) == "n2"
        assert ops.writable_replicas(0, replicas) == {"n2": "ch2:8123", "n3": "ch3:8123"}

        # Every node asking gets the same answer, read from the flags when asked (the map
        # itself is config). Whether a node's daemon runs does not matter: n4 is flagged
        # while its host is swapped (no nodes/n4), n5's daemon is merely down.
        ops.mark_replacing("n4", "host swapped", by="alice")
        everyone = {**replicas, "n4": "ch4:8123", "n5": "ch5:8123"}
        for asking in (ops, made["n1"], made["n3"]):
            assert asking.writable_replicas(0, everyone) == {
                "n2": "ch2:8123",
                "n3": "ch3:8123",
                "n5": "ch5:8123",
            }
    finally:
        raw.stop()
        raw.close()
    one_leader.assert_never_two()
    log.assert_one_leader()
    assert "n1" not in log.leaders()
    assert "n1" not in {node for _, node, _ in leader_watcher.seen}


@pytest.mark.integration
def test_failover_to_lands_on_the_requested_node(
    leadership_log: Any, coordinators: Any, leader_watcher: Any, one_leader: Any, zk_root: str
) -> None:
    log = leadership_log
    made, joined = stand(coordinators, ["n1", "n2", "n3"], log, one_leader)
    ops = made["n1"]
    assert leader(joined) == "n1"

    ops.request_failover(0, to="n3", by="bob")
    wait_until(lambda: joined["n3"].state is LeadershipState.LEADER, timeout=5.0, what="n3 leading")
    wait_until(lambda: sees_leader(ops, "n3"), timeout=2.0, what="n3 in the leader znode")
    # The request is gone and the others stand again.
    wait_until(
        lambda: made["n2"].session.exists(paths.failover(0)) is None,
        timeout=3.0,
        what="request deleted",
    )
    wait_until(
        lambda: len(made["n2"].session.children(paths.election(0))) == 3,
        timeout=3.0,
        what="all three standing again",
    )

    # Without a target: the leader resigns and whoever is next takes over.
    ops.request_failover(0, by="bob")
    new = wait_new_leader(joined, "n3", 5.0)
    assert new in ("n1", "n2")
    wait_until(
        lambda: ops.session.exists(paths.failover(0)) is None,
        timeout=3.0,
        what="request deleted",
    )
    time.sleep(0.3)
    assert leader(joined) == new  # the new leader does not resign for the old request
    one_leader.assert_never_two()
    log.assert_one_leader()
    leader_watcher.assert_epochs_increase()
    assert [n for _, _, n in log.intervals()] == ["n1", "n3", new]


@pytest.mark.integration
def test_failover_refusals_name_the_node_and_why(
    leadership_log: Any, coordinators: Any, one_leader: Any
) -> None:
    log = leadership_log
    made, joined = stand(coordinators, ["n1", "n2"], log, one_leader)
    outsider = coordinators("n9")  # registered but never joins shard 0
    ops = made["n1"]
    with pytest.raises(
        FailoverRefused, match=r"shard 0: cannot fail over to ghost: node ghost is not registered"
    ):
        ops.request_failover(0, to="ghost")
    ops.mark_replacing("n2", "bad disk", by="carol")
    with pytest.raises(FailoverRefused, match=r"node n2 is under replacement .*by carol: bad disk"):
        ops.request_failover(0, to="n2")
    with pytest.raises(FailoverRefused, match=r"node n9 is not a candidate of shard 0"):
        ops.request_failover(0, to=outsider.node_id)
    assert ops.session.exists(paths.failover(0)) is None
    assert leader(joined) == "n1"
    one_leader.assert_never_two()


@pytest.mark.integration
def test_a_failover_target_that_goes_away_is_not_waited_for(
    leadership_log: Any, coordinators: Any, one_leader: Any
) -> None:
    log = leadership_log
    # The leader ignores the request at first, so the target can die before the hand-over.
    made, joined = stand(
        coordinators, ["n1", "n2", "n3"], log, one_leader, resign_on_failover=False
    )
    ops = made["n1"]
    ops.request_failover(0, to="n3", timeout_s=60.0)
    wait_until(
        lambda: len(ops.session.children(paths.election(0))) == 2,
        timeout=3.0,
        what="n2 stepping aside for n3",
    )
    made["n3"].close()  # the target dies: its candidate goes with its session
    began = time.monotonic()
    joined["n1"].resign("failover requested")
    # Not the request's 60 s: n2 (or n1, standing again) leads at once.
    new = wait_new_leader(joined, "n3", 10.0)
    assert new in ("n1", "n2")
    assert time.monotonic() - began < 10.0
    one_leader.assert_never_two()
    log.assert_one_leader()


@pytest.mark.integration
def test_failover_target_that_does_not_take_over_times_out(
    leadership_log: Any, coordinators: Any, one_leader: Any, zk_root: str
) -> None:
    log = leadership_log
    # A leader that ignores the request (a daemon stuck in a flush): nobody takes over, and
    # the others stop stepping aside when the deadline passes.
    made, joined = stand(
        coordinators, ["n1", "n2", "n3"], log, one_leader, resign_on_failover=False
    )
    ops = made["n1"]
    ops.request_failover(0, to="n3", timeout_s=1.0)
    wait_until(joined["n1"].failover_requested.is_set, timeout=3.0, what="leader told")
    with pytest.raises(FailoverRefused, match="already pending"):
        ops.request_failover(0, to="n2")
    wait_until(
        lambda: len(ops.session.children(paths.election(0))) == 2,
        timeout=3.0,
        what="n2 stepping aside (only n1 and n3 stand)",
    )
    wait_until(
        lambda: ops.session.exists(paths.failover(0)) is None,
        timeout=5.0,
        what="expired request deleted by the leader",
    )
    wait_until(
        lambda: len(ops.session.children(paths.election(0))) == 3,
        timeout=3.0,
        what="n2 standing again",
    )
    assert leader(joined) == "n1"
    one_leader.assert_never_two()
    log.assert_one_leader()


@pytest.mark.integration
def test_leader_status_and_leave(leadership_log: Any, coordinators: Any, one_leader: Any) -> None:
    log = leadership_log
    made, joined = stand(coordinators, ["n1", "n2"], log, one_leader)
    joined["n1"].set_status("consuming")
    # n2's session may be on another ZooKeeper server, whose reads may lag the write (a
    # ZooKeeper read is not linearizable without a sync): seen there within moments.
    wait_until(
        lambda: (info := made["n2"].leader_of(0)) is not None and info.status == "consuming",
        timeout=5.0,
        what="n1's status in its leader znode",
    )
    info = made["n2"].leader_of(0)
    assert info is not None and (info.node, info.status, info.epoch) == ("n1", "consuming", 1)
    made["n1"].leave(0)
    assert wait_new_leader(joined, "n1", 2.0) == "n2"
    assert joined["n1"].state is LeadershipState.FOLLOWER
    assert made["n2"].session.children(paths.election(0)) != []
    assert len(made["n2"].session.children(paths.election(0))) == 1
    assert set(made["n2"].nodes()) == {"n1", "n2"}
    assert made["n2"].nodes()["n1"].http == "http://127.0.0.1:1/n1"
    one_leader.assert_never_two()
    log.assert_one_leader()
