"""`hakafka node replace`: flag a node under replacement (it leaves every election) or clear it."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from hakafka.coordination import Coordinator
from hakafka.ops.cluster import wait_consuming_leader
from hakafka.ops.failover import Handover


@dataclass(frozen=True)
class Replacement:
    """`node` is flagged; `moved` are the shards it led and where they went."""

    node: str
    reason: str
    moved: list[Handover] = field(default_factory=list)


def start(
    coordinator: Coordinator, shard_count: int, node: str, *, reason: str, wait_s: float, by: str
) -> Replacement:
    """Flag `node`; for every shard it led, wait up to `wait_s` until another node leads and
    consumes (OpsError if one does not; the flag stays)."""
    led = [s for s in range(shard_count) if _leader(coordinator, s) == node]
    began = time.monotonic()
    coordinator.mark_replacing(node, reason, by)
    moved = []
    for shard in led:
        info = wait_consuming_leader(coordinator, shard, node, began + wait_s)
        moved.append(
            Handover(shard, node, info.node, info.epoch, round(time.monotonic() - began, 3))
        )
    return Replacement(node, reason, moved)


def done(coordinator: Coordinator, node: str) -> bool:
    """Make `node` eligible again; False if it was not flagged."""
    return coordinator.clear_replacing(node)


def _leader(coordinator: Coordinator, shard: int) -> str | None:
    info = coordinator.leader_of(shard)
    return None if info is None else info.node
