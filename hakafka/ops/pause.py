"""`hakafka pipeline pause|resume`, and holding a pipeline paused while ops change its
checkpoint or pending block (see `hakafka/coordination/pause.py` for the protocol)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from hakafka.config import Config
from hakafka.coordination import Coordinator, PauseRecord
from hakafka.coordination.pause import StoredPause
from hakafka.ops.cluster import OpsError, UsageError, check_shard

_POLL_S = 0.1
HELD_GRACE_S = 10.0  # after the wait for the leader: the ops write itself


@dataclass(frozen=True)
class PauseOutcome:
    """What `pause` or `resume` did to one shard's pipeline."""

    shard: int
    pipeline: str
    changed: bool  # False: it already was paused (pause) or was not (resume)
    held_by: str | None  # pause: the leader that stopped it, None if no leader did in time


def pipeline_name(config: Config, name: str) -> str:
    """`name` if the config has that pipeline, else a UsageError naming those it has."""
    names = [p.name for p in config.pipelines]
    if name not in names:
        raise UsageError(f"--pipeline {name}: the config has pipelines {', '.join(names)}")
    return name


def pipeline_names(config: Config, name: str | None) -> list[str]:
    """`[name]` (checked by `pipeline_name`), or every pipeline of the config when no name
    is given."""
    return [pipeline_name(config, name)] if name else [p.name for p in config.pipelines]


def shards_of(config: Config, shard: int | None) -> list[int]:
    """`[shard]` (checked), or every shard of the cluster."""
    return [check_shard(config, shard)] if shard is not None else list(range(config.shard_count))


def wait_held(
    coordinator: Coordinator, shard: int, pipeline: str, deadline: float
) -> StoredPause | None:
    """The flag of `pipeline` once the shard's current leader recorded that it stopped it; None
    when that has not happened by `deadline` (time.monotonic()). OpsError if the flag went."""
    while True:
        stored = coordinator.pauses.read(shard, pipeline)
        if stored is None:
            raise OpsError(f"shard {shard}, pipeline {pipeline}: resumed by someone else meanwhile")
        leader = coordinator.leader_of(shard)
        held = stored.record.held
        if (
            held is not None
            and leader is not None
            and (held.node, held.epoch)
            == (
                leader.node,
                leader.epoch,
            )
        ):
            return stored
        if time.monotonic() >= deadline:
            return None
        time.sleep(_POLL_S)


def pause(
    coordinator: Coordinator,
    shards: Sequence[int],
    pipeline: str,
    *,
    by: str,
    reason: str,
    timeout_s: float,
) -> list[PauseOutcome]:
    """Pause `pipeline` in `shards` and wait up to `timeout_s` for each leader to stop it."""
    record = PauseRecord(by=by, at=time.time(), reason=reason)
    changed = {shard: coordinator.pauses.pause(shard, pipeline, record) for shard in shards}
    deadline = time.monotonic() + timeout_s
    outcomes = []
    for shard in shards:
        held = wait_held(coordinator, shard, pipeline, deadline)
        holder = None if held is None or held.record.held is None else held.record.held.node
        outcomes.append(PauseOutcome(shard, pipeline, changed[shard], holder))
    return outcomes


def resume(coordinator: Coordinator, shards: Sequence[int], pipeline: str) -> list[PauseOutcome]:
    """Resume `pipeline` in `shards`: their leaders start it again."""
    return [
        PauseOutcome(shard, pipeline, coordinator.pauses.resume(shard, pipeline), None)
        for shard in shards
    ]


@contextlib.contextmanager
def held(
    coordinator: Coordinator, shard: int, pipeline: str, *, by: str, why: str, timeout_s: float
) -> Iterator[StoredPause]:
    """`pipeline` paused in `shard` and stopped by its leader, for the duration: paused here
    (and resumed on leaving) unless ops had paused it already, which is then left paused.
    OpsError when no leader stopped it within `timeout_s`. A pause made here carries a
    deadline (`timeout_s` + `HELD_GRACE_S`): if this process dies before it resumes the
    pipeline, the leader does."""
    at = time.time()
    record = PauseRecord(by=by, at=at, reason=why, deadline=at + timeout_s + HELD_GRACE_S)
    paused_here = coordinator.pauses.pause(shard, pipeline, record)
    try:
        stored = wait_held(coordinator, shard, pipeline, time.monotonic() + timeout_s)
        if stored is None:
            leader = coordinator.leader_of(shard)
            now = "no leader" if leader is None else f"leader {leader.node} (epoch {leader.epoch})"
            raise OpsError(
                f"shard {shard}, pipeline {pipeline}: not stopped by a leader within "
                f"{timeout_s:.0f} s ({now}); nothing changed"
            )
        yield stored
    finally:
        if paused_here:
            coordinator.pauses.resume(shard, pipeline)


def describe(outcomes: Sequence[PauseOutcome], *, pausing: bool) -> str:
    """What `pipeline pause` (`pausing`) or `pipeline resume` prints: one line per outcome,
    saying what changed and, for a pause, whether a leader stopped the pipeline."""
    lines = []
    for o in outcomes:
        where = f"shard {o.shard}, pipeline {o.pipeline}"
        if not pausing:
            lines.append(f"{where}: {'resumed' if o.changed else 'was not paused'}")
            continue
        state = "paused" if o.changed else "already paused"
        holder = (
            f"stopped by {o.held_by}"
            if o.held_by
            else "no leader stopped it yet: a leader elected later will not run it"
        )
        lines.append(f"{where}: {state}, {holder}")
    return "\n".join(lines)
