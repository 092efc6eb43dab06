"""Crash points for fault-injection tests: die with SIGKILL at a named step of the protocol.

`HAKAFKA_CRASH_AT=<point>[:<n>]` makes the n-th (default first) pass through `crash_point`
with that name kill the process with SIGKILL, as a power cut would. Unset (always, in
production) it costs one dictionary lookup. The points are the steps whose interleaving
with a crash the exactly-once protocol must survive.
"""

from __future__ import annotations

import os
import signal
import threading
from dataclasses import dataclass, field

ENV = "HAKAFKA_CRASH_AT"
POINTS = (
    "consume.after_wal",  # a batch is in the WAL, not yet in the buffer
    "flush.after_pending",  # the intent is in ZooKeeper, nothing inserted
    "flush.after_insert",  # ClickHouse has the block, the checkpoint did not move
    "flush.after_checkpoint",  # checkpoint moved, WAL not yet truncated
)


@dataclass
class CrashPlan:
    point: str | None
    nth: int = 1
    _seen: int = field(default=0, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    @classmethod
    def from_environment(cls) -> CrashPlan:
        raw = os.environ.get(ENV, "")
        if not raw:
            return cls(None)
        point, _, nth = raw.partition(":")
        if point not in POINTS:
            raise ValueError(f"{ENV}={raw!r}: unknown crash point; known: {', '.join(POINTS)}")
        return cls(point, int(nth) if nth else 1)

    def hit(self, point: str) -> None:
        """Die here if this is the planned pass through `point`."""
        if point != self.point:
            return
        with self._lock:
            self._seen += 1
            if self._seen == self.nth:
                os.kill(os.getpid(), signal.SIGKILL)
