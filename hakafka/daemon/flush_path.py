"""Whether this node can flush at once: its Spark session is up and its Python workers are
warm. A warm follower's first flush as leader pays neither (DESIGN "Warm standby").

The warm-up runs on a `spark-warm-up` thread: at start-up (`spark.on_followers`, the
default), so that the node stands for election at once instead of after Spark, and again at
each election (a no-op once warm; a retry after a failure). `status` says where it stands
for `/status`, `hakafka status` and the `hakafka_flush_ready` gauge.
"""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog

log = structlog.get_logger("hakafka.flush_path")


class FlushPathState(enum.StrEnum):
    COLD = "cold"  # Spark not started: spark.on_followers = false and never led
    STARTING = "starting"  # the session or its workers are starting
    WARM = "warm"  # a flush pays neither Spark's start nor its workers'
    FAILED = "failed"  # the last warm-up failed; the next election tries again


@dataclass(frozen=True)
class FlushPathStatus:
    state: FlushPathState
    since: float  # monotonic time of the last change
    error: str | None = None
    warm_up_s: float | None = None  # how long the warm-up that made it warm took

    @property
    def ready(self) -> bool:
        return self.state is FlushPathState.WARM

    def report(self, now: float) -> dict[str, Any]:
        """The JSON form `/status` carries."""
        return {
            "state": self.state.value,
            "for_s": round(now - self.since, 1),
            "error": self.error,
            "warm_up_s": self.warm_up_s,
        }


class FlushPath:
    """Warms the node's flush path once: `start` (the Spark session, idempotent), then
    `warm_workers(session)` (a task per core, so every Python worker is forked and has
    imported the flush's modules). `stopping()` true: a failure is the shutdown's, not news.
    """

    def __init__(
        self,
        start: Callable[[], Any],
        warm_workers: Callable[[Any], None],
        stopping: Callable[[], bool],
    ) -> None:
        self._start = start
        self._warm_workers = warm_workers
        self._stopping = stopping
        self._lock = threading.Lock()  # one warm-up at a time
        self._status = FlushPathStatus(FlushPathState.COLD, time.monotonic())

    @property
    def status(self) -> FlushPathStatus:
        return self._status

    def warm_in_background(self) -> threading.Thread:
        """Start `warm` on a `spark-warm-up` thread; returns it."""
        thread = threading.Thread(target=self.warm, name="spark-warm-up", daemon=True)
        thread.start()
        return thread

    def warm(self) -> None:
        """Make the flush path warm unless it is; never raises: a failure is logged
        (`spark.warm_failed`) and shown as `failed` until the next try. A flush that comes
        first starts what it needs itself."""
        with self._lock:
            if self._status.ready:
                return
            began = time.monotonic()
            self._status = FlushPathStatus(FlushPathState.STARTING, began)
            try:
                self._warm_workers(self._start())
            except Exception as exc:
                first = next(iter(str(exc).strip().splitlines()), "")  # not the JVM's trace
                error = f"{type(exc).__name__}: {first}"
                self._status = FlushPathStatus(FlushPathState.FAILED, time.monotonic(), error)
                if not self._stopping():  # else Spark stopped under it: nothing to report
                    log.warning("spark.warm_failed", error=error)
                return
            done = time.monotonic()
            self._status = FlushPathStatus(
                FlushPathState.WARM, done, warm_up_s=round(done - began, 2)
            )
            log.info("spark.warm", seconds=round(done - began, 2))
