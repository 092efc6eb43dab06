"""The root's ACL (a warning, a refusal under `require_acl`, `restrict_acl` closing it) and
node id ownership (`nodes/<id>` of a live session is never taken over), against the real
3-member ZooKeeper ensemble."""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

import pytest
import structlog
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError

from devstack.process import wait_until
from devstack.zookeeper import ZooKeeperEnsemble
from hakafka.coordination import paths
from hakafka.coordination.errors import NodeIdTakenError, OpenAclError

AUTH = ("hakafka", "s3cret")


@pytest.mark.integration
def test_an_open_root_warns_require_acl_refuses_and_restrict_acl_closes_it(
    coordinators: Any, zookeeper_ensemble: Any, zk_root: str
) -> None:
    # A root made before auth was configured: open to anyone, like everything created in it.
    coordinators("n0", register=False).init_paths([0])
    warned = coordinators("n1", register=False, auth=AUTH)
    with structlog.testing.capture_logs() as logs:
        warned.register()
    found = [e for e in logs if e["event"] == "zookeeper.acl_open"]
    assert len(found) == 1, logs
    assert found[0]["log_level"] == "warning"
    assert found[0]["root"] == zk_root
    assert found[0]["open_to"] == ["write", "create", "delete", "admin"]
    assert "hakafka init" in found[0]["fix"]
    assert "n1" in warned.nodes()

    strict = coordinators("n2", register=False, auth=AUTH, require_acl=True)
    with pytest.raises(OpenAclError) as refused:
        strict.register()
    assert str(refused.value).startswith(
        f"zookeeper.require_acl: the ACL of {zk_root} lets anyone (world:anyone) "
        "write, create, delete, admin: "
    )
    assert "`hakafka init`" in str(refused.value)
    assert "n2" not in warned.nodes()

    # root, nodes, replacing, shards, shards/0 and its layout, epoch, nodes/n1: all open.
    changed = warned.restrict_acl()
    assert changed >= 8
    assert warned.restrict_acl() == 0  # idempotent
    with structlog.testing.capture_logs() as logs:
        strict.register()
    assert [e for e in logs if e["event"] == "zookeeper.acl_open"] == []
    # Another session's write: warned's ZooKeeper member may apply it a moment later.
    wait_until(lambda: set(warned.nodes()) == {"n1", "n2"}, timeout=5, what="n2 registered")

    anonymous = KazooClient(hosts=zookeeper_ensemble.hosts, timeout=10.0)
    anonymous.start(timeout=10)
    try:
        for write in (
            lambda: anonymous.set(f"{zk_root}{paths.epoch(0)}", b"7"),
            lambda: anonymous.create(f"{zk_root}/nodes/intruder", b"{}"),
            lambda: anonymous.delete(f"{zk_root}/nodes/n1"),
            lambda: anonymous.get(f"{zk_root}{paths.epoch(0)}"),
        ):
            with pytest.raises(NoAuthError):
                write()
    finally:
        anonymous.stop()
        anonymous.close()


@pytest.mark.integration
def test_restrict_acl_needs_auth(coordinators: Any) -> None:
    with pytest.raises(ValueError, match=r"zookeeper.auth_user is not set"):
        coordinators("n0", register=False).restrict_acl()


@pytest.mark.integration
def test_a_node_id_held_by_a_live_session_is_refused_not_taken_over(
    coordinators: Any, zk_root: str
) -> None:
    first = coordinators("n1")
    owner = first.session.session_id
    first.register()  # the same session again: a no-op, not a conflict
    second = coordinators("n1", register=False)
    config = second.config
    started = time.monotonic()
    with pytest.raises(NodeIdTakenError) as refused:
        second.register()
    took = time.monotonic() - started
    text = str(refused.value)
    assert text.startswith(
        f"node id n1 is held by another live session (registered by pid {os.getpid()} "
        "on host 127.0.0.1 at "
    ), text
    assert f"ZooKeeper session 0x{owner:x}" in text
    assert "stop the other daemon, or give this one its own `node`" in text
    # It waited for a previous session to end (it may be a restart), and no longer.
    expiry = config.session_timeout_s + config.request_timeout_s
    assert expiry <= took < expiry + 3 * config.request_timeout_s, took
    stat = first.session.exists(paths.node("n1"))
    assert stat is not None and stat.ephemeralOwner == owner
    assert list(first.nodes()) == ["n1"]


@pytest.mark.integration
def test_a_restart_before_the_old_session_expired_registers_once_it_ends(
    coordinators: Any, candidates: Any
) -> None:
    crashed = candidates("n1")  # registers nodes/n1 in a process of its own
    watcher = coordinators("watcher", register=False)
    before = watcher.session.exists(paths.node("n1"))
    assert before is not None and before.ephemeralOwner != 0
    crashed.signal(signal.SIGKILL)  # its session lives on until ZooKeeper expires it
    restarted = coordinators("n1", register=False)
    started = time.monotonic()
    restarted.register()
    took = time.monotonic() - started
    config = restarted.config
    assert took < config.session_timeout_s + config.request_timeout_s, took
    # The watcher may read from another ensemble member, one that has not applied the
    # create yet: ZooKeeper orders reads per session only, so it syncs first.
    watcher.session.sync(paths.node("n1"))
    after = watcher.session.exists(paths.node("n1"))
    assert after is not None
    assert after.ephemeralOwner == restarted.session.session_id != before.ephemeralOwner


@pytest.mark.integration
def test_a_restart_waits_for_the_old_session_across_a_zookeeper_leader_change(
    coordinators: Any, candidates: Any, zookeeper_ensemble: ZooKeeperEnsemble
) -> None:
    # A new quorum leader gives every session a fresh timeout, the crashed daemon's too (and
    # drops every client's connection): a wait counted from before refused the restart with
    # NodeIdTakenError although the old session then expired (found by the chaos run).
    crashed = candidates("n1", session_timeout=8.0)
    crashed.signal(signal.SIGKILL)
    restarted = coordinators("n1", register=False, session_timeout_s=8.0)
    outcome: list[BaseException | None] = []

    def register() -> None:
        try:
            restarted.register()
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=register, name="test-register")
    thread.start()
    time.sleep(4.0)  # the restart waits for the old session
    leader = zookeeper_ensemble.leader_id()
    assert leader is not None
    zookeeper_ensemble.stop_member(leader, sig=signal.SIGKILL)
    time.sleep(1.0)
    zookeeper_ensemble.start_member(leader)
    thread.join(60)
    assert outcome == [None]
    node = restarted.session.exists(paths.node("n1"))
    assert node is not None and node.ephemeralOwner == restarted.session.session_id
