"""`hakafka reshard NEW_CONFIG`: move a running cluster to NEW_CONFIG's shard layout
(`shard_count`, explicit `partitions` lists), exactly once.

1. Request the reshard (`/reshard`, against the recorded settings' version). Every leader
   of the recorded layout drains: it commits everything it holds, consumes nothing, and
   reports it.
2. Wait until every shard of the recorded layout reported drained (`--timeout`).
3. Compute each pipeline's checkpoints in the new layout: every partition's offset moves to
   the shard that owns it now, from whichever shard held it.
4. One multi-op: check nothing moved since (settings version, each drained term's epoch),
   write the checkpoints, record the new settings, end the reshard. Leaders of the old
   layout then differ from the record and step down; nodes configured with the new layout
   (already running, waiting, or deployed now) stand and consume from the moved offsets.

Anything short of step 4 aborts the reshard (the leaders consume again in the old layout),
so a failed reshard never leaves the cluster paused.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from hakafka.config import Config
from hakafka.consumer import partitions_for_shard
from hakafka.coordination import (
    Checkpoint,
    ClusterSettings,
    Coordinator,
    DrainedInfo,
    PipelineSettings,
    ReshardRequest,
)
from hakafka.coordination.fenced import StoredCheckpoint
from hakafka.coordination.reshard import ReshardRaceError
from hakafka.coordination.writers import PUSH_TOPIC
from hakafka.drift import cluster_settings, compare
from hakafka.ops.cluster import OpsError

POLL_S = 0.2
COMPLETE_GRACE_S = 10.0  # after the drain timeout: the checks and the completing multi-op
LAYOUT_KEYS = ("shard_count", "partitions.")


@dataclass(frozen=True)
class Move:
    """One partition's checkpoint moved (or kept) by a reshard."""

    pipeline: str
    partition: int
    offset: int
    before: int
    after: int

    def __str__(self) -> str:
        where = (
            f"stays in shard {self.after}"
            if self.before == self.after
            else f"shard {self.before} -> shard {self.after}"
        )
        return f"{self.pipeline}: partition {self.partition} at offset {self.offset}: {where}"


def target_settings(recorded: ClusterSettings, config: Config) -> ClusterSettings:
    """`config`'s layout over the recorded settings; OpsError if `config` changes more than
    the layout (those changes go through `hakafka init --update` first)."""
    wanted = cluster_settings(config)
    target = ClusterSettings(
        wanted.shard_count,
        recorded.engine,
        {s: e for s, e in recorded.endpoints.items() if s < wanted.shard_count},
        wanted.pipelines,
    ).with_endpoints(wanted.endpoints)
    other = [d for d in compare(recorded, target) if not any(k in d.key for k in LAYOUT_KEYS)]
    if other:
        raise OpsError(
            "reshard changes only the shard layout (shard_count, partitions); record the "
            "other differences first (hakafka init --update) or revert them:\n"
            + "\n".join(f"  - {d}" for d in other)
        )
    return target


def owner(settings: PipelineSettings, shard_count: int, partition: int) -> int | None:
    """The shard that reads `partition` of the pipeline's topic in a layout, or None."""
    for shard in range(shard_count):
        explicit = settings.partitions.get(shard) if settings.partitions else None
        if partitions_for_shard([partition], shard, shard_count, explicit):
            return shard
    return None


def move_checkpoints(
    target: ClusterSettings, stored: Mapping[tuple[int, str], StoredCheckpoint]
) -> tuple[dict[tuple[int, str], Checkpoint], list[Move]]:
    """Each `(shard, pipeline)`'s checkpoint in the `target` layout, from the `stored` ones of
    every shard. OpsError when a partition's offset is in two shards or has no owner."""
    # Push writers' positions stay in their shard: a writer is numbered per shard, and a
    # retry after the reshard must still be known for one.
    new: dict[tuple[int, str], Checkpoint] = {
        key: {PUSH_TOPIC: dict(cp.offsets[PUSH_TOPIC])} if cp.offsets.get(PUSH_TOPIC) else {}
        for key, cp in stored.items()
    }
    moves: list[Move] = []
    for name, settings in sorted(target.pipelines.items()):
        found: dict[int, tuple[int, int]] = {}  # partition -> (shard, offset)
        for (shard, pipeline), cp in sorted(stored.items()):
            if pipeline != name:
                continue
            for partition, offset in cp.offsets.get(settings.topic, {}).items():
                if partition in found:
                    raise OpsError(
                        f"pipeline {name!r}: partition {partition} has a checkpoint in shard "
                        f"{found[partition][0]} and in shard {shard}; resolve it by hand first"
                    )
                found[partition] = (shard, offset)
        for partition, (before, offset) in sorted(found.items()):
            after = owner(settings, target.shard_count, partition)
            if after is None:
                raise OpsError(
                    f"pipeline {name!r}: partition {partition} (checkpoint at {offset} in shard "
                    f"{before}) belongs to no shard of the new layout; add it to a partitions list"
                )
            new.setdefault((after, name), {}).setdefault(settings.topic, {})[partition] = offset
            moves.append(Move(name, partition, offset, before, after))
    return new, moves


def reshard(
    coordinator: Coordinator,
    config: Config,
    *,
    by: str,
    timeout: float,
    progress: Callable[[str], None],
) -> list[Move]:
    """Move the running cluster to `config`'s layout (see the module docstring); the moves.
    OpsError (the reshard aborted, the old layout consuming again) says why it did not."""
    found = coordinator.settings.read()
    if found is None:
        raise OpsError("no shard-wide settings are recorded: run hakafka init first")
    recorded, version = found
    target = target_settings(recorded, config)
    now = time.time()
    # Past this the leaders abort it themselves: this process died (SIGKILL, a lost ssh
    # session) before it could complete or abort.
    deadline = now + timeout + COMPLETE_GRACE_S
    request = ReshardRequest(by, now, version, target.shard_count, deadline)
    if not coordinator.reshard.request(request):
        running = coordinator.reshard.read()
        raise OpsError(
            f"a reshard is already in progress ({running}); wait for it to end, or end it "
            "with hakafka reshard --abort"
        )
    try:
        drained = _wait_drained(coordinator, recorded.shard_count, timeout, progress)
        shards = range(max(recorded.shard_count, target.shard_count))
        names = sorted(set(recorded.pipelines) | set(target.pipelines))
        for shard in shards:
            for name in names:
                if (intent := coordinator.pending_intent(shard, name)) is not None:
                    raise OpsError(
                        f"shard {shard} pipeline {name!r} still has pending block "
                        f"{intent.block_id} although its leader reported drained"
                    )
        stored = {
            (shard, name): coordinator.reshard.checkpoint(shard, name)
            for shard in shards
            for name in names
        }
        checkpoints, moves = move_checkpoints(target, stored)
        writes = {key: (stored[key], checkpoints.get(key, {})) for key in stored}
        coordinator.reshard.complete(request, target, drained, writes)
    except (OpsError, ReshardRaceError) as exc:
        coordinator.reshard.abort()
        raise OpsError(
            f"{exc}\nreshard aborted: the shards consume again in the old layout"
        ) from None
    except BaseException:
        coordinator.reshard.abort()
        raise
    return moves


def describe(moves: Sequence[Move], shard_count: int) -> str:
    """What a completed `reshard` prints: each partition's move, then the new shard count and
    how many checkpoints were placed."""
    done = f"resharded to {shard_count} shards: {len(moves)} checkpoints placed"
    return "\n".join([*map(str, moves), done])


def describe_abort(ended: bool) -> str:
    """What `reshard --abort` prints: whether it `ended` a reshard in progress."""
    return "reshard aborted" if ended else "no reshard in progress (nothing to do)"


def _wait_drained(
    coordinator: Coordinator, shards: int, timeout: float, progress: Callable[[str], None]
) -> dict[int, DrainedInfo]:
    """The drained reports of shards `0..shards-1`, once all are in; OpsError after
    `timeout` s naming the shards still missing."""
    deadline = time.monotonic() + timeout
    reported: set[int] = set()
    while True:
        drained = {s: d for s, d in coordinator.reshard.drained().items() if s < shards}
        for shard in sorted(set(drained) - reported):
            progress(
                f"shard {shard}: drained by {drained[shard].node} (epoch {drained[shard].epoch})"
            )
        reported = set(drained)
        if len(drained) == shards:
            return drained
        if time.monotonic() >= deadline:
            missing = sorted(set(range(shards)) - set(drained))
            leaders = {s: coordinator.leader_of(s) for s in missing}
            named = ", ".join(
                f"shard {s} ({'no leader' if info is None else 'led by ' + info.node})"
                for s, info in leaders.items()
            )
            raise OpsError(f"timed out after {timeout:g} s waiting for {named} to drain")
        time.sleep(POLL_S)
