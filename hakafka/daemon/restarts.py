"""When a failed pipeline restarts, and when a leader that keeps failing hands its shard over.

A pipeline that fails while the term holds (the broker or ClickHouse away during recovery, a
flush that cannot land) is restarted within the same term after a growing delay
(`RESTART_BACKOFF`: 1 s, 2 s, 4 s, ... 30 s), as Flink's exponential-delay restart strategy
does: a transient outage heals without ops, and `status` shows the error and the restart count
meanwhile. One that ran `RESTART_RESET_S` since its last restart starts over at 1 s, and so
does every pipeline of a new term. A bad message under `on_error = "fail"` is not retried:
the pipeline stays failed (the node unhealthy, the systemd watchdog unfed) until ops act.

A leader that keeps failing hands the shard over, as HaKafka yields to a healthier replica
(`HandoverPolicy`): after `failures` failed runs of a pipeline within its window (counted
across terms), or at once for a failure of this node's own disk (its `data_dir` or WAL
directory). The shard runner then stops its pipelines, leaves the election and stands again
only after the policy's cool-down (`Cooldown`), and only while another node stands in the
shard: the last candidate keeps the shard and keeps restarting.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from hakafka.pipeline import PipelineStatus
from retry_policy import Backoff

RESTART_BACKOFF = Backoff(1.0, 30.0)  # the delays before restarting a failed pipeline
RESTART_RESET_S = 600.0  # a pipeline that ran this long since its last restart starts over at 1 s


@dataclass
class Restarts:
    """The restarts of one pipeline in one term."""

    count: int = 0
    last_at: float | None = None
    """Monotonic time of the last restart."""
    failed_at: float | None = None
    """Monotonic time its current failure was first seen; None while it runs."""


@dataclass(frozen=True)
class HandoverPolicy:
    """When a failing leader hands its shard over, and for how long it then stays out."""

    failures: int = 3
    """Failed runs of one pipeline within `window_s` that hand the shard over."""
    window_s: float = 300.0
    cooldown_s: float = 60.0
    """How long a node that handed a shard over stays out of its election."""

    def count(self, failed_at: list[float], now: float) -> int:
        """Record a failure at `now` in `failed_at` (one pipeline's monotonic failure times,
        across terms), forgetting those out of the window; how many are in it."""
        failed_at[:] = [t for t in failed_at if now - t < self.window_s]
        failed_at.append(now)
        return len(failed_at)

    def reason(self, name: str, status: PipelineStatus, failures: int) -> str | None:
        """Why a leader whose pipeline `name` failed (`status`, `failures` times in the
        window) should hand the shard over, or None if it should not."""
        if status.local_fault:
            return f"pipeline {name} failed on this node's disk: {status.error}"
        if failures >= self.failures:
            return (
                f"pipeline {name} failed {failures} times in {self.window_s:.0f} s, "
                f"last: {status.error}"
            )
        return None


@dataclass(frozen=True)
class Cooldown:
    """This node handed the shard over: it stands again at `until` (monotonic time)."""

    until: float
    reason: str
    at: float = field(default_factory=time.time)
    """Unix time of the hand-over."""
