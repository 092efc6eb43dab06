"""How `hakafka reshard` places each partition's checkpoint in the new layout, and what it
refuses to change: pure logic (tests/daemon/test_daemon_reshard.py runs the whole reshard)."""

from __future__ import annotations

import pytest

from hakafka.coordination.fenced import StoredCheckpoint
from hakafka.coordination.writers import PUSH_TOPIC
from hakafka.drift import cluster_settings
from hakafka.ops.cluster import OpsError
from hakafka.ops.reshard import move_checkpoints, target_settings
from tests.helpers.configs import config


def stored(offsets: dict[int, int]) -> StoredCheckpoint:
    return StoredCheckpoint({"orders": offsets}, 3)


def test_each_partition_moves_to_the_shard_that_owns_it_in_the_new_layout() -> None:
    recorded = cluster_settings(config())
    three = config(
        {
            "shard_count = 2": "shard_count = 3",
            "shards = [0, 1]": "shards = [2]",
            '[clickhouse.replicas.1]\nn1 = "10.0.0.2:8123"': (
                '[clickhouse.replicas.1]\nn1 = "10.0.0.2:8123"\n'
                '[clickhouse.replicas.2]\nn1 = "10.0.0.3:8123"'
            ),
        }
    )
    target = target_settings(recorded, three)
    assert target.shard_count == 3
    checkpoints = {
        (0, "orders"): stored({0: 10, 2: 12, 4: 14}),
        (1, "orders"): stored({1: 11, 3: 13, 5: 15}),
        (2, "orders"): StoredCheckpoint({}, None),
    }
    new, moves = move_checkpoints(target, checkpoints)
    assert new == {
        (0, "orders"): {"orders": {0: 10, 3: 13}},
        (1, "orders"): {"orders": {1: 11, 4: 14}},
        (2, "orders"): {"orders": {2: 12, 5: 15}},
    }
    assert [str(m) for m in moves if m.before != m.after] == [
        "orders: partition 2 at offset 12: shard 0 -> shard 2",
        "orders: partition 3 at offset 13: shard 1 -> shard 0",
        "orders: partition 4 at offset 14: shard 0 -> shard 1",
        "orders: partition 5 at offset 15: shard 1 -> shard 2",
    ]


def test_explicit_partition_lists_decide_and_an_orphan_partition_is_refused() -> None:
    recorded = cluster_settings(config())
    listed = config({'name = "orders"': 'name = "orders"\npartitions = {0 = [0, 1], 1 = [2]}'})
    target = target_settings(recorded, listed)
    checkpoints = {(0, "orders"): stored({0: 5, 2: 7}), (1, "orders"): stored({1: 6})}
    new, _ = move_checkpoints(target, checkpoints)
    assert new == {(0, "orders"): {"orders": {0: 5, 1: 6}}, (1, "orders"): {"orders": {2: 7}}}
    with pytest.raises(OpsError, match=r"partition 3 .* belongs to no shard of the new layout"):
        move_checkpoints(target, {**checkpoints, (1, "orders"): stored({1: 6, 3: 8})})


def test_a_partition_checkpointed_in_two_shards_is_refused() -> None:
    target = cluster_settings(config())
    with pytest.raises(OpsError, match="partition 2 has a checkpoint in shard 0 and in shard 1"):
        move_checkpoints(target, {(0, "orders"): stored({2: 1}), (1, "orders"): stored({2: 1})})


def test_a_reshard_changes_the_layout_only() -> None:
    recorded = cluster_settings(config())
    other = config(
        {"shard_count = 2": "shard_count = 3", 'on_error = "dead_letter"': 'on_error = "skip"'}
    )
    with pytest.raises(
        OpsError, match=r"(?s)reshard changes only the shard layout.*on_error"
    ) as refused:
        target_settings(recorded, other)
    assert "shard_count: recorded" not in str(refused.value)


def test_push_writers_positions_stay_in_their_shard() -> None:
    # Writers are numbered per shard: their positions (@push) are not partitions of the
    # topic and do not move, so a retry after the reshard is still known as one.
    target = cluster_settings(config())
    checkpoints = {
        (0, "orders"): StoredCheckpoint({"orders": {0: 5}, PUSH_TOPIC: {-1: 1 << 20}}, 3),
        (1, "orders"): StoredCheckpoint({"orders": {1: 6}, PUSH_TOPIC: {-1: 7}}, 4),
    }
    new, moves = move_checkpoints(target, checkpoints)
    assert new == {
        (0, "orders"): {PUSH_TOPIC: {-1: 1 << 20}, "orders": {0: 5}},
        (1, "orders"): {PUSH_TOPIC: {-1: 7}, "orders": {1: 6}},
    }
    assert [m.partition for m in moves] == [0, 1]
