"""Leadership read back, not remembered: ZooKeeper calls whose outcome the caller cannot know.

A TCP proxy (`devstack.zk_proxy`) sits between one coordinator and a real ZooKeeper member
and loses exactly one request, or the reply to it, together with the connection. The session
survives (the client reconnects within the session timeout), so whatever the server applied
stays: a `leader` znode owned by a node that thinks it follows, a second candidate, a
resignation that never reached the server. Each test fails on a node that remembers what it
asked for instead of reading ZooKeeper back.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kazoo.client import KazooClient

from devstack.process import wait_until
from devstack.zk_proxy import Op, ZkProxy
from devstack.zookeeper import ZooKeeperEnsemble
from hakafka.coordination import (
    Coordinator,
    Leadership,
    LeadershipState,
    LostLeadership,
    Resumed,
    Suspended,
    paths,
)

TAKEOVER_S = 15.0
"""How long a correction may take: a reconnection, a retry and a reconciliation round."""


@pytest.fixture
def proxy(zookeeper_ensemble: ZooKeeperEnsemble) -> Iterator[ZkProxy]:
    member = zookeeper_ensemble.members[0]
    with ZkProxy(("127.0.0.1", member.client_port)) as made:
        yield made


@pytest.fixture
def reader(zookeeper_ensemble: ZooKeeperEnsemble, zk_root: str) -> Iterator[KazooClient]:
    client = KazooClient(hosts=f"{zookeeper_ensemble.hosts}{zk_root}")
    client.start(timeout=10)
    yield client
    client.stop()
    client.close()


def leads(leadership: Leadership) -> bool:
    return leadership.state is LeadershipState.LEADER


def owner_of_leader(reader: KazooClient) -> int | None:
    reader.sync(paths.leader(0))
    stat = reader.exists(paths.leader(0))
    return None if stat is None else int(stat.ephemeralOwner)


def session_of(coordinator: Coordinator) -> int:
    sid = coordinator.session.session_id  # the session whose ephemerals the test reads back
    assert sid is not None
    return sid


@pytest.mark.integration
def test_an_election_whose_reply_is_lost_is_adopted_not_waited_on(
    coordinators: Any, proxy: ZkProxy, reader: KazooClient
) -> None:
    n1 = coordinators("n1", hosts=proxy.hosts, session_timeout_s=6.0)
    proxy.drop_reply_to(Op.MULTI)  # the election multi-op: epoch + 1 and create `leader`
    first = n1.join(0)
    assert proxy.dropped_event.wait(10), "n1 never sent its election multi-op"
    n2 = coordinators("n2")
    second = n2.join(0)

    wait_until(lambda: leads(first), timeout=TAKEOVER_S, what="n1 adopting the term it won")
    assert not leads(second)
    assert owner_of_leader(reader) == session_of(n1)
    info = n2.leader_of(0)
    assert info is not None and info.node == "n1" and info.epoch == 1  # one election, not two
    first.fenced().commit_checkpoint("p", {"t": {0: 5}})


@pytest.mark.integration
def test_a_lost_reply_to_the_candidate_create_leaves_no_second_candidate(
    coordinators: Any, proxy: ZkProxy, reader: KazooClient
) -> None:
    coordinators("n0").init_paths([0])  # the layout exists: the only create left is the candidate
    n1 = coordinators("n1", hosts=proxy.hosts, session_timeout_s=6.0)
    proxy.drop_reply_to(Op.CREATE, path=paths.candidate_prefix(0))
    leadership = n1.join(0)
    assert proxy.dropped_event.wait(10), "n1 never created its candidate"

    wait_until(lambda: leads(leadership), timeout=TAKEOVER_S, what="n1 leading alone")
    wait_until(
        lambda: len(reader.get_children(paths.election(0))) == 1,
        timeout=TAKEOVER_S,
        what="the orphan candidate deleted",
    )


@pytest.mark.integration
@pytest.mark.parametrize("how", ["resign", "leave"])
def test_a_resignation_whose_request_is_lost_is_retried_until_it_lands(
    coordinators: Any, proxy: ZkProxy, reader: KazooClient, how: str
) -> None:
    n1 = coordinators("n1", hosts=proxy.hosts, session_timeout_s=6.0)
    first = n1.join(0)
    wait_until(lambda: leads(first), timeout=10, what="n1 leading")
    n2 = coordinators("n2")
    second = n2.join(0)
    n2.settle(10)  # n2 stands

    proxy.lose_request_to(Op.MULTI)  # the resign multi-op: delete `leader` and the candidate
    if how == "resign":
        first.resign("test")
    else:
        n1.leave(0)
    assert proxy.dropped_event.wait(10)
    assert not leads(first)  # side effects stopped at once, whatever ZooKeeper says

    wait_until(lambda: leads(second), timeout=TAKEOVER_S, what="n2 taking over")
    assert owner_of_leader(reader) == session_of(n2)
    if how == "leave":
        wait_until(lambda: first.left, timeout=TAKEOVER_S, what="n1's leave confirmed")
        names = reader.get_children(paths.election(0))
        assert all(reader.get(paths.candidate(0, n))[0] == b"n2" for n in names), names
    else:
        wait_until(
            lambda: len(reader.get_children(paths.election(0))) == 2,
            timeout=TAKEOVER_S,
            what="n1 standing again as the newest candidate",
        )
        assert not leads(first)


@pytest.mark.integration
def test_a_suspended_leader_whose_checks_time_out_on_a_live_connection_resumes(
    coordinators: Any, proxy: ZkProxy
) -> None:
    events: list[Any] = []
    # A long session: kazoo keeps the reconnected connection through the stall below, so no
    # second CONNECTED comes to re-check the suspended term; only a timer can.
    n1 = coordinators("n1", hosts=proxy.hosts, session_timeout_s=20.0, request_timeout_s=1.0)
    leadership = n1.join(0, on_change=events.append)
    wait_until(lambda: leads(leadership), timeout=10, what="n1 leading")
    proxy.stall_next_connection(3.0)  # every check after the reconnection times out for 3 s
    proxy.cut()
    wait_until(lambda: any(isinstance(e, Suspended) for e in events), timeout=10, what="suspended")
    wait_until(lambda: leads(leadership), timeout=TAKEOVER_S, what="the term resumed")
    assert any(isinstance(e, Resumed) for e in events)
    assert not any(isinstance(e, LostLeadership) for e in events)
    assert leadership.epoch == 1
    leadership.fenced().commit_checkpoint("p", {"t": {0: 7}})


@pytest.mark.integration
def test_registration_waits_out_a_server_that_answers_late(
    coordinators: Any, proxy: ZkProxy, reader: KazooClient
) -> None:
    # A daemon starting while ZooKeeper stalls (a frozen server; in the chaos run, while a
    # killed daemon's session still held its node id): every request of the new connection
    # times out for 4 s while the connection stays up. Start-up died of it: exit 1 with
    # "ZooKeeper create /nodes/n1: no answer within 1 s".
    n1 = coordinators(
        "n1", hosts=proxy.hosts, session_timeout_s=10.0, request_timeout_s=1.0, register=False
    )
    proxy.stall_next_connection(4.0)
    proxy.cut()
    n1.register()
    reader.sync(paths.node("n1"))
    stat = reader.exists(paths.node("n1"))
    assert stat is not None and stat.ephemeralOwner == session_of(n1)
