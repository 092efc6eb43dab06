"""Which replica: a write's order (writable only, local first) and its backoff, a read's
spread over a shard's replicas (never one under replacement, each server once)."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from chlib.cluster import Cluster, ShardReplicas
from chlib.replicas import NoWritableReplicaError, Replica, RetryPolicy, write_order


def test_replica_order_and_backoff() -> None:
    a, b = Replica("a", "h", 1), Replica("b", "h", 2, local=True)
    off = Replica("c", "h", 3, local=True, writable=False)
    assert [r.name for r in write_order([a, off, b])] == ["b", "a"]
    with pytest.raises(NoWritableReplicaError, match="no writable replica among \\['c'\\]"):
        write_order([off])
    policy = RetryPolicy(backoff_initial=0.25, backoff_max=1.0)
    assert [policy.backoff(n) for n in (1, 2, 3, 4)] == [0.25, 0.5, 1.0, 1.0]


def test_reads_spread_over_replicas_and_skip_those_under_replacement() -> None:
    shard = ShardReplicas(
        0,
        (Replica("a", "ha", 1), Replica("b", "hb", 1), Replica("c", "hc", 1, writable=False)),
    )
    cluster = Cluster((shard, ShardReplicas(1, (Replica("d", "hd", 1),))))
    rng = random.Random(7)
    firsts = Counter(cluster.read_order(rng)[0][0][0] for _ in range(1000))
    assert set(firsts) == {"ha", "hb"}, "never the replica under replacement"
    assert min(firsts.values()) > 400, f"spread evenly: {firsts}"
    order = cluster.read_order(random.Random(1))
    assert sorted(order[0]) == [("ha", 1), ("hb", 1)] and order[1] == (("hd", 1),)

    replaced = Cluster((ShardReplicas(3, (Replica("c", "hc", 1, writable=False),)),))
    with pytest.raises(ValueError, match=r"shard 3: no replica to read.*\['c'\]"):
        replaced.read_order(rng)


def test_shards_on_one_server_are_read_once() -> None:
    # The dev stack's daemons may put several shards on one ClickHouse: one table, read once.
    one = Cluster.from_hosts([[("ch", 8123)], [("ch", 8123)], [("ch2", 8123)]])
    assert one.read_order(random.Random(0)) == ((("ch", 8123),), (("ch2", 8123),))
