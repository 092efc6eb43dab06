"""`hakafka failover`: move a shard's leadership and wait until the new leader consumes."""

from __future__ import annotations

import time
from dataclasses import dataclass

from hakafka.coordination import Coordinator, FailoverRefused, PinRecord
from hakafka.ops.cluster import Diagnosis, OpsError, until, wait_consuming_leader

MAX_HOLD_S = 30 * 86_400.0


@dataclass(frozen=True)
class Handover:
    """Shard `shard` moved from `previous` to `leader` (epoch `epoch`) in `seconds`."""

    shard: int
    previous: str
    leader: str
    epoch: int
    seconds: float
    held_until: float | None = None  # Unix time the balancer leaves it there until


def failover(
    coordinator: Coordinator,
    shard: int,
    *,
    to: str | None,
    wait_s: float,
    by: str,
    diagnose: Diagnosis | None = None,
    hold_s: float = 0.0,
) -> Handover:
    """Ask the leader of `shard` to hand over (to `to` if given) and wait up to `wait_s` for
    the new leader to consume. With `hold_s`, `to` is pinned for that long from now (the
    balancer leaves the shard there; `to` may already lead); without, a pin the shard had is
    dropped. Raises FailoverRefused (with the reason) for an ineligible target, a hold
    without a target or a shard without leader, OpsError on timeout (with `diagnose`'s why
    the new leader does not consume) or if another node took over."""
    if not 0 <= hold_s <= MAX_HOLD_S:  # also nan and inf
        raise FailoverRefused(
            f"shard {shard}: --hold must be 0 to {MAX_HOLD_S:.0f} seconds (30 days), got {hold_s:g}"
        )
    if hold_s and to is None:
        raise FailoverRefused(f"shard {shard}: --hold needs --to, the node to keep it on")
    current = coordinator.leader_of(shard)
    if current is None:
        raise FailoverRefused(f"shard {shard} has no leader right now: nothing to hand over")
    pin = PinRecord(node=to, until=time.time() + hold_s, by=by, at=time.time()) if to else None
    if to == current.node:
        if pin is None or not hold_s:
            raise FailoverRefused(f"shard {shard}: {to} already leads it (epoch {current.epoch})")
        coordinator.set_pin(shard, pin)
        return Handover(shard, to, to, current.epoch, 0.0, pin.until)
    began = time.monotonic()
    coordinator.request_failover(shard, to=to, by=by, timeout_s=wait_s)
    # Once the request is made (a refused one changes nothing): the new term is younger
    # than the balancer's `settle`, so nothing moves it before the pin is there.
    coordinator.set_pin(shard, pin if hold_s else None)
    info = wait_consuming_leader(coordinator, shard, current.node, began + wait_s, diagnose)
    seconds = round(time.monotonic() - began, 3)
    if to is not None and info.node != to:
        raise OpsError(f"shard {shard}: {info.node} took over, not {to}, after {seconds} s")
    held = pin.until if pin is not None and hold_s else None
    return Handover(shard, current.node, info.node, info.epoch, seconds, held)


def describe(h: Handover) -> str:
    """What `failover` prints, and `node replace --start` for each shard it moved: who leads
    the shard now, from whom, and how long the handover took."""
    if h.previous == h.leader:
        text = f"shard {h.shard}: {h.leader} leads (epoch {h.epoch}) already"
    else:
        text = (
            f"shard {h.shard}: {h.leader} leads (epoch {h.epoch}), took over from {h.previous} "
            f"in {h.seconds:.2f} s"
        )
    if h.held_until is not None:
        text += f"; held there until {until(h.held_until)}: leadership balance leaves it"
    return text
