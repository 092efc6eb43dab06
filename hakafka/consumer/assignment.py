"""Which partitions of a topic a shard consumes (pure functions, no Kafka access)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass


def partitions_for_shard(
    all_partitions: Iterable[int],
    shard: int,
    shard_count: int,
    explicit: Iterable[int] | None = None,
) -> list[int]:
    """The sorted partitions of `all_partitions` that belong to `shard`.

    Without `explicit`, partition `p` belongs to shard `p % shard_count`, so every partition
    belongs to exactly one shard. With `explicit`, the shard owns exactly the listed partitions
    that exist (a listed partition that does not exist yet is picked up once it appears).
    """
    if shard_count < 1:
        raise ValueError(f"shard_count must be >= 1, got {shard_count}")
    if not 0 <= shard < shard_count:
        raise ValueError(f"shard must be in 0..{shard_count - 1}, got {shard}")
    existing = set(all_partitions)
    if explicit is not None:
        return sorted(existing.intersection(explicit))
    return sorted(p for p in existing if p % shard_count == shard)


def check_explicit_assignment(per_shard: Mapping[int, Iterable[int]]) -> None:
    """Raise `ValueError` naming the partition if an explicit assignment gives it to two shards."""
    owner: dict[int, int] = {}
    for shard, partitions in sorted(per_shard.items()):
        for partition in partitions:
            if partition < 0:
                raise ValueError(f"shard {shard}: partition {partition} is negative")
            if partition in owner:
                raise ValueError(
                    f"partition {partition} is assigned to shard {owner[partition]} "
                    f"and to shard {shard}"
                )
            owner[partition] = shard


@dataclass(frozen=True)
class ShardAssignment:
    """A shard's rule for picking partitions; `explicit` overrides the `p % shard_count` rule.

    With `lanes` > 1 it is one lane's part of the shard: the shard's partitions are ranked
    (their place in `explicit`, else `p // shard_count`, which is the place of `p` among the
    shard's partitions of the modulo rule) and lane `lane` owns those whose rank is `lane`
    modulo `lanes`. A rank never changes when partitions are added, so every lane keeps
    what it had and new partitions spread over the lanes."""

    shard: int
    shard_count: int
    explicit: tuple[int, ...] | None = None
    lane: int = 0
    lanes: int = 1

    def __post_init__(self) -> None:
        if not 0 <= self.lane < self.lanes:
            raise ValueError(f"lane must be in 0..{self.lanes - 1}, got {self.lane}")

    def select(self, all_partitions: Iterable[int]) -> list[int]:
        """The sorted partitions of `all_partitions` this shard (or lane) owns."""
        owned = partitions_for_shard(all_partitions, self.shard, self.shard_count, self.explicit)
        if self.lanes == 1:
            return owned
        return [p for p in owned if self._rank(p) % self.lanes == self.lane]

    def _rank(self, partition: int) -> int:
        if self.explicit is not None:
            return self.explicit.index(partition)
        return partition // self.shard_count

    def for_lane(self, lane: int, lanes: int) -> ShardAssignment:
        """Lane `lane`'s part of this shard when it consumes in `lanes` lanes."""
        return ShardAssignment(self.shard, self.shard_count, self.explicit, lane, lanes)
