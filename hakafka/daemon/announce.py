"""A term's `consuming` announcement: the shard's `leader` znode says `consuming` once every
pipeline the term started (or restarted) consumes, which `hakafka failover --wait` and the
status commands read. It waits on a thread of its own (`announce-<shard>`): on the shard's
thread it would hold back later events, and a loss must stop the pipelines at once."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from structlog.typing import FilteringBoundLogger

from hakafka.coordination import Leadership
from hakafka.pipeline import PipelineLeader

RECOVERY_TIMEOUT_S = 300.0  # how long the pipelines may take to recover before it gives up


def announce_consuming(
    shard: int,
    leadership: Leadership,
    pipelines: Sequence[PipelineLeader],
    log: FilteringBoundLogger,
) -> None:
    """Start the `announce-<shard>` thread for `pipelines` (as they are now) and return."""
    threading.Thread(
        target=_announce,
        args=(leadership, list(pipelines), log),
        name=f"announce-{shard}",
        daemon=True,
    ).start()


def _announce(
    leadership: Leadership, pipelines: list[PipelineLeader], log: FilteringBoundLogger
) -> None:
    """Publish `consuming` in the leader znode once every pipeline consumes; log
    `leader.recovery_failed` instead when one failed or they are still recovering at the
    timeout."""
    began = time.monotonic()
    if not all(p.wait_consuming(RECOVERY_TIMEOUT_S) for p in pipelines):
        failed = {p.config.name: p.status.error for p in pipelines if p.status.error}
        if failed or any(p.status.state.live for p in pipelines):
            log.error(
                "leader.recovery_failed",
                seconds=round(time.monotonic() - began, 3),
                errors=failed,
            )
        # Otherwise they were stopped (a hand-over, a lost term): that event is logged.
        return
    try:
        leadership.set_status("consuming")
    except Exception as exc:  # informative only: the CLI waits on it
        log.warning("leader.status_failed", error=repr(exc))
        return
    log.info("leader.consuming", seconds=round(time.monotonic() - began, 3))
