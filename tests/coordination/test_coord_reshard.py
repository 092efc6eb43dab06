"""The reshard's ZooKeeper records against the real ensemble: drained reports fenced by the
term (a stale one replaced), and an abort that removes reports landing meanwhile."""

from __future__ import annotations

import time
from typing import Any

import pytest

from hakafka.coordination import DrainedInfo, FencedError, ReshardRequest


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
    session = store._session
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
