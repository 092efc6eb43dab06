"""`hakafka failover`: move a shard's leadership and wait until the new leader consumes."""

from __future__ import annotations

import time
from dataclasses import dataclass

from hakafka.coordination import Coordinator, FailoverRefused
from hakafka.ops.cluster import Diagnosis, OpsError, wait_consuming_leader


@dataclass(frozen=True)
class Handover:
    """Shard `shard` moved from `previous` to `leader` (epoch `epoch`) in `seconds`."""

    shard: int
    previous: str
    leader: str
    epoch: int
    seconds: float


def failover(
    coordinator: Coordinator,
    shard: int,
    *,
    to: str | None,
    wait_s: float,
    by: str,
    diagnose: Diagnosis | None = None,
) -> Handover:
    """Ask the leader of `shard` to hand over (to `to` if given) and wait up to `wait_s` for
    the new leader to consume. Raises FailoverRefused (with the reason) for an ineligible
    target or a shard without leader, OpsError on timeout (with `diagnose`'s why the new
    leader does not consume) or if another node took over."""
    current = coordinator.leader_of(shard)
    if current is None:
        raise FailoverRefused(f"shard {shard} has no leader right now: nothing to hand over")
    if to == current.node:
        raise FailoverRefused(f"shard {shard}: {to} already leads it (epoch {current.epoch})")
    began = time.monotonic()
    coordinator.request_failover(shard, to=to, by=by, timeout_s=wait_s)
    info = wait_consuming_leader(coordinator, shard, current.node, began + wait_s, diagnose)
    seconds = round(time.monotonic() - began, 3)
    if to is not None and info.node != to:
        raise OpsError(f"shard {shard}: {info.node} took over, not {to}, after {seconds} s")
    return Handover(shard, current.node, info.node, info.epoch, seconds)


def describe(h: Handover) -> str:
    """What `failover` prints, and `node replace --start` for each shard it moved: who leads
    the shard now, from whom, and how long the handover took."""
    return (
        f"shard {h.shard}: {h.leader} leads (epoch {h.epoch}), took over from {h.previous} "
        f"in {h.seconds:.2f} s"
    )
