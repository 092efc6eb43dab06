"""The node's view of itself, as `/status` returns it and `hakafka status` shows it.

Built from the parts the daemon holds (its shard runners and coordinator), not from the
daemon itself: this module does not import `node.py`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from hakafka.coordination import CoordinationError, Coordinator
from hakafka.daemon.shard import ShardRunner
from hakafka.pipeline import PipelineLeader


def pipeline_status(p: PipelineLeader) -> dict[str, Any]:
    s, now = p.status, time.monotonic()
    stats = p.buffer.rows.stats()
    flushes = list(s.flushes)
    last = flushes[-1] if flushes else None
    return {
        "name": p.config.name,
        "topic": p.config.topic,
        "state": s.state,
        "error": s.error or s.flush_error or s.registry_error,
        "waiting": [
            {"state": w.kind, "for_s": round(now - w.since, 1), "detail": w.detail}
            for w in s.current_waits()
        ],
        "restarts": s.restarts,
        "restartable": s.restartable,
        "stalled_s": round(p.stalled_for(now), 1),
        "buffer_rows": p.buffer.rows.row_count,
        "buffer_bytes": p.buffer.nbytes,
        "buffer_limit_bytes": p.buffer.limit_bytes,
        "open_rows": stats.rows,
        "positions": p.positions(),
        "lag": p.lag(),
        "lanes": [asdict(lane) for lane in p.lanes()],
        "pushed": asdict(p.pushes()),
        "checkpoint": s.checkpoint,
        "pending_block": s.pending_block,
        "reflushing": s.reflushing,
        "last_flush_at": last.at if last else None,
        "last_flush_rows": last.rows if last else 0,
        "last_flush_seconds": last.seconds if last else 0.0,
        "recent_flushes": [asdict(f) for f in flushes],  # oldest first
        "replayed_rows": s.replayed_rows,
        "refetched_rows": s.refetched_rows,
    }


def _leader(coordinator: Coordinator, shard: int) -> dict[str, Any] | None:
    """The shard's leader as ZooKeeper names it (whichever node that is), or None while there
    is none or ZooKeeper cannot be asked."""
    if not coordinator.connected:
        return None
    try:
        info = coordinator.leader_of(shard)
    except CoordinationError:
        return None
    return None if info is None else {"node": info.node, "epoch": info.epoch, "status": info.status}


def _cooldown(runner: ShardRunner) -> dict[str, Any] | None:
    """Why this node handed the shard over, when, and in how many seconds it stands again."""
    cooldown = runner.cooldown
    if cooldown is None:
        return None
    left = max(0.0, cooldown.until - time.monotonic())
    return {"reason": cooldown.reason, "at": cooldown.at, "stands_again_in_s": round(left, 1)}


def node_status(
    *,
    node: str,
    runners: Sequence[ShardRunner],
    coordinator: Coordinator,
    started_at: float,
    healthy: bool,
) -> dict[str, Any]:
    """Role, epoch and pipelines of every shard this node serves (`runners`)."""
    shards = []
    for runner in runners:
        leadership = runner.leadership
        shards.append(
            {
                "shard": runner.shard,
                "role": "leader" if runner.leading else "follower",
                "standing": runner.standing,
                "state": leadership.state.value if leadership is not None else "starting",
                "epoch": leadership.epoch if leadership is not None else None,
                "leading_since": runner.leading_since,
                "leader": _leader(coordinator, runner.shard),
                "pipelines": [pipeline_status(p) for p in runner.pipelines],
                "paused": sorted(runner.paused),
                "cooldown": _cooldown(runner),
            }
        )
    return {
        "node": node,
        "version": coordinator.endpoints.version,
        "pid": coordinator.endpoints.pid,
        "uptime_s": round(time.time() - started_at, 1),
        "zookeeper_connected": coordinator.connected,
        "healthy": healthy,
        "shards": shards,
    }
