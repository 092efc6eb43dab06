"""A ClickHouse cluster as a read sees it: the replicas of each shard and, for a fresh read,
the live buffers above the committed checkpoint.

Plain Python (no pyspark): `hakafka` builds a `Cluster` from its config and ZooKeeper
(`hakafka.ops.cluster_view`), a user from hosts per shard (`Cluster.from_hosts`).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from chlib.replicas import Replica

if TYPE_CHECKING:
    import pyarrow as pa

Hosts = tuple[tuple[str, int], ...]


class LiveBuffer(Protocol):
    """The rows the shard leaders hold and have not committed yet, and the checkpoint."""

    def rows(self) -> pa.Table:
        """Every row in the leaders' buffers of every shard, read now (``_partition`` and
        ``_offset`` among the columns); an error, never a shard left out."""

    def checkpoint(self) -> Mapping[int, int]:
        """Partition -> next offset of the committed checkpoint over every shard, read now:
        every row below it is in ClickHouse."""


@dataclass(frozen=True)
class ShardReplicas:
    """The ClickHouse replicas of one shard. A replica with ``writable=False`` is under
    replacement and never read."""

    shard: int
    replicas: tuple[Replica, ...]

    def readable(self) -> tuple[Replica, ...]:
        return tuple(r for r in self.replicas if r.writable)


@dataclass(frozen=True)
class Cluster:
    """Every shard of the table once; `buffer` makes `read_table(include_buffer=True)`
    possible."""

    shards: tuple[ShardReplicas, ...]
    buffer: LiveBuffer | None = None

    @classmethod
    def from_hosts(cls, shards: Sequence[Sequence[tuple[str, int]]]) -> Cluster:
        """A cluster of `shards`, each the ``(host, port)`` of its replicas."""
        return cls(
            tuple(
                ShardReplicas(i, tuple(Replica(f"{h}:{p}", h, p) for h, p in hosts))
                for i, hosts in enumerate(shards)
            )
        )

    def read_order(self, rng: random.Random) -> tuple[Hosts, ...]:
        """Per shard, its readable replicas rotated by a random start: reads spread evenly over
        the replicas, the rest of each list is the failover order. Shards with the same
        replicas (several shards on one server, as on the dev stack) share one table and
        are read once. ValueError names a shard with no replica left to read (all under
        replacement), or an empty cluster."""
        if not self.shards:
            raise ValueError("the cluster has no shard to read")
        order = []
        seen: set[frozenset[tuple[str, int]]] = set()
        for shard in self.shards:
            servers = frozenset((r.host, r.port) for r in shard.replicas)
            if servers in seen:
                continue
            seen.add(servers)
            readable = shard.readable()
            if not readable:
                names = [r.name for r in shard.replicas]
                raise ValueError(
                    f"shard {shard.shard}: no replica to read, all under replacement: {names}"
                )
            start = rng.randrange(len(readable))
            rotated = readable[start:] + readable[:start]
            order.append(tuple((r.host, r.port) for r in rotated))
        return tuple(order)


def committed_condition(checkpoint: Mapping[int, int]) -> str:
    """The ClickHouse condition selecting exactly the rows below `checkpoint` (partition ->
    next offset); a partition without a checkpoint has none committed."""
    if not checkpoint:
        return "false"
    cases = ", ".join(f"_partition = {p}, {int(o)}" for p, o in sorted(checkpoint.items()))
    return f"_offset < multiIf({cases}, 0)"


def format_shards(shards: Sequence[Hosts]) -> str:
    """``"h1:1,h2:1;h3:1"``: replicas by commas, shards by semicolons (the ``shards`` option)."""
    return ";".join(",".join(f"{h}:{p}" for h, p in hosts) for hosts in shards)
