"""The reshard's ZooKeeper records against the real ensemble: drained reports fenced by the
term (a stale one replaced), and an abort that removes reports landing meanwhile."""

from __future__ import annotations

import time
from typing import Any, cast

import pytest

from devstack.process import wait_until
from hakafka.coordination import DrainedInfo, FencedError, ReshardRequest
from hakafka.daemon.reshard_follower import ReshardFollower


def lead(coordinators: Any) -> tuple[Any, Any]:
    """A coordinator of node n1 and its leadership of shard 0."""
    coordinator = coordinators("n1")
    leadership = coordinator.join(0)
    assert leadership.wait_leader(10), "n1 did not become leader"
    return coordinator, leadership


@pytest.mark.integration
def test_a_drained_report_is_fenced_replaces_a_stale_one_and_needs_a_reshard(
    coordinators: Any,
) -> None:
    coordinator, leadership = lead(coordinators)
    store = coordinator.reshard
    info = DrainedInfo("n1", leadership.epoch, leadership.token)
    assert store.mark_drained(0, info) is False, "no reshard in progress: nothing written"
    assert store.request(ReshardRequest("ops", time.time(), 0, 3))
    stale = DrainedInfo("n0", leadership.epoch - 1, leadership.token - 1)
    with pytest.raises(FencedError, match="drained report refused: epoch"):
        store.mark_drained(0, stale)
    assert store.mark_drained(0, info) is True
    assert store.mark_drained(0, info) is True, "a report of this term again replaces it"
    assert store.drained() == {0: info}
    assert store.abort() is True
    assert store.read() is None and store.drained() == {}
    assert store.abort() is False


@pytest.mark.integration
def test_an_abort_removes_reports_that_land_while_it_runs(coordinators: Any) -> None:
    coordinator, leadership = lead(coordinators)
    store = coordinator.reshard
    assert store.request(ReshardRequest("ops", time.time(), 0, 3))
    session = coordinator.session  # the one `store` reads and writes through
    children = session.children
    info = DrainedInfo("n1", leadership.epoch, leadership.token)

    def listed_then_reported(path: str, watch: Any = None) -> list[str]:
        names: list[str] = children(path, watch)
        if not names:  # the first listing: a report lands right after it
            store.mark_drained(0, info)
        return names

    session.children = listed_then_reported
    try:
        assert store.abort() is True
    finally:
        session.children = children
    assert store.read() is None and store.drained() == {}


class StandInGuard:
    def check(self) -> None:
        """The settings still agree (nothing was recorded by an aborted reshard)."""


class StandInRunner:
    def __init__(self) -> None:
        self.told: list[str | None] = []

    def reshard(self, request: str | None) -> None:
        self.told.append(request)


@pytest.mark.integration
def test_a_reshard_left_behind_by_a_dead_command_is_aborted_at_its_deadline(
    coordinators: Any,
) -> None:
    # `hakafka reshard` made the request and died (SIGKILL, a dropped ssh session): nothing
    # else would end it, and every leader would hold its shard drained with green health.
    ops, node = coordinators("ops", register=False), coordinators("n1")
    runner = StandInRunner()
    follower = ReshardFollower(node, cast(Any, StandInGuard()), [cast(Any, runner)])
    follower.start()

    def told() -> list[str | None]:
        """What the runners were told since the request, each change once (a watch may repeat
        a state). The first read may find no reshard yet: n1's ZooKeeper server may not have
        applied the request `ops` wrote through another member (reads are not linearizable)."""
        follower.poll()  # the daemon's main loop polls about once a second
        changes = [r for i, r in enumerate(runner.told) if i == 0 or runner.told[i - 1] != r]
        return changes[1:] if changes[:1] == [None] else changes

    at = time.time()
    # 8 s: the follower must see the request before its deadline even on a busy machine
    # (with 1.5 s, then 4 s, a slow first poll found it expired already: seen in full runs).
    assert ops.reshard.request(ReshardRequest("ops@host", at, 0, 3, deadline=at + 8.0))
    wait_until(
        lambda: told() == [f"ops@host@{at}"],
        timeout=10,
        what="the runners told to drain",
    )
    follower.poll()
    assert ops.reshard.read() is not None, "aborted before its deadline"
    wait_until(
        lambda: told() == [f"ops@host@{at}", None],
        timeout=15,
        what="the expired reshard aborted and the runners told to consume again",
    )
    assert ops.reshard.read() is None
    assert time.time() >= at + 8.0
    # A request written before deadlines existed expires 600 s after it was made.
    assert ReshardRequest("ops", 100.0, 0, 3).deadline == 700.0
