"""Fenced checkpoints and flush intents against the real 3-member ZooKeeper ensemble."""

from __future__ import annotations

from typing import Any

import pytest
from kazoo.client import KazooClient

from devstack.process import wait_until
from hakafka.coordination import FencedError, PendingIntent, paths
from hakafka.coordination.fenced import CheckpointRegressionError
from hakafka.coordination.writers import WriterElsewhereError


def lead(coordinators: Any, node: str = "n1") -> Any:
    leadership = coordinators(node).join(0)
    assert leadership.wait_leader(10), f"{node} did not become leader"
    return leadership


@pytest.mark.integration
def test_pending_then_commit_moves_the_checkpoint_and_clears_the_intent(coordinators: Any) -> None:
    fenced = lead(coordinators).fenced()
    assert fenced.read_checkpoint("orders") == {}
    assert fenced.read_pending("orders") is None
    intent = PendingIntent(
        block_id="b1", ranges={"orders": {0: (0, 100), 3: (50, 75)}}, epoch=fenced.epoch
    )
    fenced.write_pending("orders", intent)
    assert fenced.read_pending("orders") == intent
    assert fenced.commit_checkpoint("orders", {"orders": {0: 100, 3: 75}}) == {
        "orders": {0: 100, 3: 75}
    }
    assert fenced.read_pending("orders") is None
    # Partitions not named keep their offset; a commit without a pending intent works too.
    assert fenced.commit_checkpoint("orders", {"orders": {3: 80}, "refunds": {1: 7}}) == {
        "orders": {0: 100, 3: 80},
        "refunds": {1: 7},
    }
    assert fenced.read_checkpoint("orders") == {"orders": {0: 100, 3: 80}, "refunds": {1: 7}}
    # Pipelines are separate.
    assert fenced.read_checkpoint("other") == {}


@pytest.mark.integration
def test_stale_epoch_gets_fenced_error_and_changes_nothing(
    coordinators: Any, zookeeper_ensemble: Any, zk_root: str
) -> None:
    leadership = lead(coordinators)
    fenced = leadership.fenced()
    fenced.commit_checkpoint("p", {"t": {0: 10}})
    fenced.write_pending("p", PendingIntent("b2", {"t": {0: (10, 20)}}, fenced.epoch))
    # Another writer moves the epoch (what a successor does when it is elected) while this
    # leader still believes it leads: the server-side check refuses its writes.
    raw = KazooClient(hosts=zookeeper_ensemble.hosts, timeout=10.0)
    raw.start(timeout=10)
    try:
        raw.set(f"{zk_root}{paths.epoch(0)}", b"99")
        with pytest.raises(FencedError) as refused:
            fenced.commit_checkpoint("p", {"t": {0: 20}})
        message = str(refused.value)
        assert "shard 0" in message
        assert f"expected epoch version {fenced.token} (epoch 1)" in message
        assert f"found epoch version {fenced.token + 1} (epoch 99)" in message
        with pytest.raises(FencedError, match="write_pending"):
            fenced.write_pending("p", PendingIntent("b3", {"t": {0: (20, 30)}}, fenced.epoch))
        checkpoint, _ = raw.get(f"{zk_root}{paths.checkpoint(0, 'p')}")
        pending, _ = raw.get(f"{zk_root}{paths.pending(0, 'p')}")
    finally:
        raw.stop()
        raw.close()
    assert checkpoint == b'{"t":{"0":10}}'
    assert b'"block_id":"b2"' in pending


@pytest.mark.integration
def test_fenced_state_of_a_resigned_leader_refuses_locally(coordinators: Any) -> None:
    leadership = lead(coordinators)
    fenced = leadership.fenced()
    leadership.resign("test")
    with pytest.raises(FencedError, match="no longer leads with epoch 1"):
        fenced.commit_checkpoint("p", {"t": {0: 1}})
    # The node stood again and leads with a new epoch and token.
    assert leadership.wait_leader(5)
    assert (leadership.epoch, leadership.token) == (2, 2)
    leadership.fenced().commit_checkpoint("p", {"t": {0: 1}})
    with pytest.raises(FencedError, match="no longer leads"):
        fenced.read_checkpoint("p")


@pytest.mark.integration
def test_not_leading_has_no_fenced_state(coordinators: Any, one_leader: Any) -> None:
    one_leader.add_leadership("n1", lead(coordinators, "n1"))
    follower = coordinators("n2").join(0)
    one_leader.add_leadership("n2", follower)
    wait_until(
        lambda: len(coordinators.made[1].session.children(paths.election(0))) == 2,
        timeout=5,
        what="n2 standing",
    )
    with pytest.raises(FencedError, match="node n2 is not the leader"):
        follower.fenced()
    one_leader.assert_never_two()


@pytest.mark.integration
def test_a_checkpoint_never_moves_backwards(
    coordinators: Any, zookeeper_ensemble: Any, zk_root: str
) -> None:
    fenced = lead(coordinators).fenced()
    fenced.commit_checkpoint("p", {"t": {0: 100, 1: 50}})
    fenced.write_pending("p", PendingIntent("b4", {"t": {0: (90, 100)}}, fenced.epoch))
    with pytest.raises(CheckpointRegressionError) as refused:
        fenced.commit_checkpoint("p", {"t": {0: 99, 1: 60}})
    assert str(refused.value) == (
        "shard 0, pipeline p: checkpoint commit refused, it would move backwards "
        "(t[0]: committed 100, proposed 99); nothing written"
    )
    # Nothing written: neither partition moved and the intent is still there.
    assert fenced.read_checkpoint("p") == {"t": {0: 100, 1: 50}}
    assert fenced.read_pending("p") is not None
    # The same offset again, or a partition never committed, is fine.
    assert fenced.commit_checkpoint("p", {"t": {0: 100, 2: 0}}) == {"t": {0: 100, 1: 50, 2: 0}}


@pytest.mark.integration
def test_the_monotonic_check_holds_against_a_write_between_read_and_commit(
    coordinators: Any, zookeeper_ensemble: Any, zk_root: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    fenced = lead(coordinators).fenced()
    fenced.commit_checkpoint("p", {"t": {0: 100}})
    path = f"{zk_root}{paths.checkpoint(0, 'p')}"
    raw = KazooClient(hosts=zookeeper_ensemble.hosts, timeout=10.0)
    raw.start(timeout=10)
    session = coordinators.made[0].session  # n1's, which `fenced` reads and writes through
    exists = session.exists
    writes: list[Any] = []

    def exists_after_a_concurrent_write(znode: str) -> Any:
        # Asked for `pending` after commit_checkpoint read the checkpoint (100), before its
        # multi-op.
        if znode.endswith("/pending") and not writes:
            writes.append(raw.set(path, b'{"t":{"0":500}}'))
        return exists(znode)

    monkeypatch.setattr(session, "exists", exists_after_a_concurrent_write)
    try:
        with pytest.raises(CheckpointRegressionError, match="committed 500, proposed 200"):
            fenced.commit_checkpoint("p", {"t": {0: 200}})
        data, _ = raw.get(path)
    finally:
        raw.stop()
        raw.close()
    assert len(writes) == 1, "the concurrent write happened once, between read and commit"
    # The multi-op checked the version it compared against: 200 never overwrote 500.
    assert data == b'{"t":{"0":500}}'


@pytest.mark.integration
def test_push_writers_are_numbered_once_for_the_cluster_and_bound_to_one_shard(
    coordinators: Any,
) -> None:
    zero = lead(coordinators, "n1").fenced()
    one = coordinators("n2").join(1)
    assert one.wait_leader(10), "n2 did not lead shard 1"
    other = one.fenced()
    assert zero.writer_number("orders", "spark-q1-p0") == 0
    assert zero.writer_number("orders", "spark-q1-p0") == 0  # known: not numbered again
    assert other.writer_number("orders", "spark-q1-p1") == 1  # unique over the shards
    with pytest.raises(WriterElsewhereError, match=r"pushes to shard 0 .* not to shard 1"):
        other.writer_number("orders", "spark-q1-p0")
    assert zero.writer_number("refunds", "spark-q1-p0") == 0  # pipelines number apart
    with pytest.raises(ValueError, match="invalid writer name"):
        zero.writer_number("orders", "a/b")
