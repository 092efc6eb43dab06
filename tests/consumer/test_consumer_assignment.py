"""Partition-to-shard assignment (pure)."""

from __future__ import annotations

import pytest

from hakafka.consumer import ShardAssignment, check_explicit_assignment, partitions_for_shard


@pytest.mark.parametrize("shard_count", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("partition_count", [1, 7, 16])
def test_modulo_assignment_covers_every_partition_exactly_once(
    shard_count: int, partition_count: int
) -> None:
    partitions = range(partition_count)
    owned = [partitions_for_shard(partitions, s, shard_count) for s in range(shard_count)]
    flat = [p for shard in owned for p in shard]
    assert sorted(flat) == list(partitions)
    for shard, mine in enumerate(owned):
        assert all(p % shard_count == shard for p in mine)


def test_explicit_assignment_takes_listed_existing_partitions() -> None:
    spec = ShardAssignment(shard=1, shard_count=2, explicit=(0, 3, 9))
    assert spec.select(range(6)) == [0, 3]
    assert spec.select(range(10)) == [0, 3, 9]  # 9 is picked up once it exists


@pytest.mark.parametrize(("shard", "count"), [(2, 2), (-1, 2), (0, 0)])
def test_invalid_shard_numbers_are_rejected(shard: int, count: int) -> None:
    with pytest.raises(ValueError, match="shard"):
        partitions_for_shard(range(4), shard, count)


def test_explicit_assignment_conflicts_name_the_partition() -> None:
    check_explicit_assignment({0: [0, 1], 1: [2, 3]})
    with pytest.raises(ValueError, match="partition 1 is assigned to shard 0 and to shard 1"):
        check_explicit_assignment({0: [0, 1], 1: [1, 2]})


def test_lanes_split_a_shards_partitions_disjointly_and_keep_them_when_partitions_are_added() -> (
    None
):
    shard = ShardAssignment(1, 2)  # the odd partitions
    lanes = [shard.for_lane(i, 2) for i in range(2)]
    assert [lane.select(range(8)) for lane in lanes] == [[1, 5], [3, 7]]
    # Four more partitions: each lane keeps what it had and takes every other new one.
    assert [lane.select(range(12)) for lane in lanes] == [[1, 5, 9], [3, 7, 11]]
    three = [shard.for_lane(i, 3) for i in range(3)]
    got = [lane.select(range(12)) for lane in three]
    assert sorted(p for part in got for p in part) == shard.select(range(12))
    assert got == [[1, 7], [3, 9], [5, 11]]


def test_lanes_of_an_explicit_list_go_by_its_order() -> None:
    shard = ShardAssignment(0, 2, explicit=(6, 2, 4))
    assert [shard.for_lane(i, 2).select(range(8)) for i in range(2)] == [[4, 6], [2]]
    with pytest.raises(ValueError, match=r"lane must be in 0\.\.1, got 2"):
        shard.for_lane(2, 2)
