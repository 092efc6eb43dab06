"""Sessions: expiry and re-registration, digest ACLs and the chroot, against the real
3-member ZooKeeper ensemble; an unreachable or frozen server, against standalone ones."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError

from devstack.process import freeze, running, wait_until
from devstack.zookeeper import ZooKeeperEnsemble
from hakafka.coordination import (
    Coordinator,
    FencedError,
    LostLeadership,
    NodeInfo,
    Resumed,
    Suspended,
    ZkConfig,
    ZooKeeperUnavailableError,
    paths,
)


def expire_session(hosts: str, coordinator: Any) -> None:
    """Expire `coordinator`'s session the way ZooKeeper's own tests do: open a second client
    with the same session id and password, then close it."""
    sid, password = coordinator.session.client.client_id
    twin = KazooClient(hosts=hosts, client_id=(sid, password), timeout=10.0)
    twin.start(timeout=10)
    twin.stop()
    twin.close()


@pytest.mark.integration
def test_lost_session_drops_leadership_then_reregisters_and_stands_again(
    coordinators: Any, zookeeper_ensemble: Any, leadership_log: Any, one_leader: Any
) -> None:
    events: list[Any] = []
    n1 = coordinators("n1")
    n2 = coordinators("n2")
    first = n1.join(0, on_change=events.append)
    one_leader.add_leadership("n1", first)
    assert first.wait_leader(10)
    second = n2.join(0, on_change=leadership_log.callback("n2"))
    one_leader.add_leadership("n2", second)
    wait_until(
        lambda: len(n2.session.children(paths.election(0))) == 2, timeout=5, what="n2 standing"
    )
    old_session = n1.session.session_id
    expire_session(zookeeper_ensemble.hosts, n1)
    assert second.wait_leader(10), "n2 did not take over after n1's session expired"
    wait_until(
        lambda: any(isinstance(e, LostLeadership) for e in events),
        timeout=10,
        what="n1 told it lost leadership",
    )
    lost = [e for e in events if isinstance(e, LostLeadership)]
    assert lost[0].reason == "zookeeper session lost"
    # A new session: nodes/n1 is back (owned by it) and n1 stands again behind n2.
    wait_until(
        lambda: n1.session.connected and n1.session.session_id != old_session,
        timeout=10,
        what="n1 reconnected with a new session",
    )
    wait_until(lambda: "n1" in n2.nodes(), timeout=5, what="nodes/n1 re-created")
    stat = n2.session.exists(paths.node("n1"))
    assert stat is not None and stat.ephemeralOwner == n1.session.session_id
    wait_until(
        lambda: len(n2.session.children(paths.election(0))) == 2,
        timeout=5,
        what="n1 standing again",
    )
    second.resign("test")
    assert first.wait_leader(5)
    one_leader.assert_never_two()


@pytest.mark.integration
def test_digest_acl_keeps_other_clients_out_and_root_is_a_chroot(
    coordinators: Any, zookeeper_ensemble: Any, zk_root: str
) -> None:
    secure = coordinators("n1", auth=("hakafka", "s3cret"))
    assert secure.join(0).wait_leader(10)
    assert secure.leader_of(0) is not None
    anonymous = KazooClient(hosts=zookeeper_ensemble.hosts, timeout=10.0)
    anonymous.start(timeout=10)
    wrong = KazooClient(
        hosts=zookeeper_ensemble.hosts, timeout=10.0, auth_data=[("digest", "hakafka:nope")]
    )
    right = KazooClient(
        hosts=zookeeper_ensemble.hosts, timeout=10.0, auth_data=[("digest", "hakafka:s3cret")]
    )
    wrong.start(timeout=10)
    right.start(timeout=10)
    try:
        # Everything lives under the root (the chroot)...
        data, _ = right.get(f"{zk_root}{paths.leader(0)}")
        assert b'"node":"n1"' in data
        assert right.get_children(f"{zk_root}{paths.NODES}") == ["n1"]
        # ...and only the configured user may read or change it (the root's parent, shared
        # with other clusters, stays open).
        parent, name = zk_root.rsplit("/", 1)
        assert name in anonymous.get_children(parent)
        anonymous.ensure_path(f"{zk_root}-neighbour")
        for client in (anonymous, wrong):
            with pytest.raises(NoAuthError):
                client.get(f"{zk_root}{paths.leader(0)}")
            with pytest.raises(NoAuthError):
                client.set(f"{zk_root}{paths.epoch(0)}", b"7")
    finally:
        for client in (anonymous, wrong, right):
            client.stop()
            client.close()


def test_config_errors_name_the_key() -> None:
    with pytest.raises(ValueError, match=r"zookeeper.root 'hakafka': must be an absolute path"):
        ZkConfig(hosts="127.0.0.1:2181", root="hakafka")
    with pytest.raises(ValueError, match=r"zookeeper.hosts .*put the chroot in zookeeper.root"):
        ZkConfig(hosts="127.0.0.1:2181/hakafka")
    with pytest.raises(ValueError, match=r"zookeeper.session_timeout_s must be positive"):
        ZkConfig(hosts="127.0.0.1:2181", session_timeout_s=0)


@pytest.mark.integration
def test_unreachable_zookeeper_suspends_the_leader_within_the_session_timeout(
    zookeeper: Any, zk_root: str
) -> None:
    config = ZkConfig(hosts=zookeeper.hosts, root=zk_root, session_timeout_s=3.0)
    coordinator = Coordinator(config, "n1", NodeInfo("127.0.0.1", "", "", 1, "t"))
    coordinator.start()
    events: list[Any] = []
    server = zookeeper.members[0].pid
    try:
        leadership = coordinator.join(0, on_change=events.append)
        assert leadership.wait_leader(10)
        os.kill(server, signal.SIGSTOP)  # the server stops answering: the connection goes quiet
        frozen = time.time()
        try:
            wait_until(
                lambda: any(isinstance(e, Suspended) for e in events), timeout=6, what="Suspended"
            )
            suspended = next(e for e in events if isinstance(e, Suspended))
            assert suspended.at - frozen < config.session_timeout_s
            with pytest.raises(FencedError, match="state suspended"):
                leadership.fenced()
        finally:
            os.kill(server, signal.SIGCONT)
        # The same session comes back (Resumed) or a new one re-elects this only candidate.
        assert leadership.wait_leader(15)
        wait_until(
            lambda: any(isinstance(e, Resumed) for e in events) or leadership.epoch == 2,
            timeout=5,
            what="Resumed (same session) or a new epoch (new session)",
        )
        leadership.fenced().commit_checkpoint("p", {"t": {0: 1}})
    finally:
        coordinator.close()


@pytest.mark.integration
def test_a_read_against_a_frozen_server_fails_within_the_request_timeout(
    tmp_path: Path,
) -> None:
    # A server of its own: freezing the shared ones would stall every other test's clients.
    with running(ZooKeeperEnsemble(tmp_path / "zk", members=1)) as zookeeper:
        # A long session: kazoo declares a silent connection lost only after 2/3 of it (over
        # 6 s here), so what ends the call below can only be the request timeout.
        config = ZkConfig(
            hosts=zookeeper.hosts, root="/frozen", session_timeout_s=20.0, request_timeout_s=1.0
        )
        coordinator = Coordinator(config, "n1", NodeInfo("127.0.0.1", "", "", os.getpid(), "t"))
        coordinator.start()
        try:
            coordinator.register()
            server = zookeeper.members[0].pid
            assert server is not None
            freeze(server)  # the connection stays up; nothing answers
            try:
                for read in (lambda: coordinator.leader_of(0), coordinator.nodes):
                    started = time.monotonic()
                    with pytest.raises(ZooKeeperUnavailableError, match=r"no answer within 1.0 s"):
                        read()
                    took = time.monotonic() - started
                    assert took < config.request_timeout_s + 2.0, f"the read took {took:.2f} s"
            finally:
                os.kill(server, signal.SIGCONT)
            # The session outlived the freeze: reads are answered again.
            wait_until(lambda: "n1" in coordinator.nodes(), timeout=10, what="reads answered")
        finally:
            coordinator.close()
