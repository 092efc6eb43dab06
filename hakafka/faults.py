"""Fault points for fault-injection tests: die or hang at a named step of the protocol.

`HAKAFKA_CRASH_AT=<point>[:<n>]` makes the n-th (default first) pass through that point kill
the process with SIGKILL, as a power cut would. `HAKAFKA_HANG_AT=<point>[:<n>]` makes the
thread that passes there block instead (for an hour), as on a hung disk or driver. Unset
(always, in production) a point costs one comparison. The points are the steps whose
interleaving with a fault the exactly-once protocol must survive.
"""

from __future__ import annotations

import os
import signal
import threading
from dataclasses import dataclass, field

ENV = "HAKAFKA_CRASH_AT"
HANG_ENV = "HAKAFKA_HANG_AT"
HANG_S = 3600.0
POINTS = (
    "recover.after_replay",  # a new leader replayed its WAL, not yet consuming
    "consume.after_wal",  # a batch is in the WAL, not yet in the buffer
    "flush.after_pending",  # the intent is in ZooKeeper, nothing inserted
    "flush.after_insert",  # ClickHouse has the block, the checkpoint did not move
    "flush.after_checkpoint",  # checkpoint moved, WAL not yet truncated
)


@dataclass
class CrashPlan:
    """Where to fault: `point` (None: nowhere), on its `nth` pass, by `hang` or by SIGKILL."""

    point: str | None
    nth: int = 1
    hang: bool = False
    _seen: int = field(default=0, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    @classmethod
    def from_environment(cls) -> CrashPlan:
        """The plan in $HAKAFKA_CRASH_AT or $HAKAFKA_HANG_AT (at most one of them)."""
        set_vars = [name for name in (ENV, HANG_ENV) if os.environ.get(name)]
        if not set_vars:
            return cls(None)
        if len(set_vars) > 1:
            raise ValueError(f"set only one of {ENV} and {HANG_ENV}")
        name = set_vars[0]
        raw = os.environ[name]
        point, _, nth = raw.partition(":")
        if point not in POINTS:
            raise ValueError(f"{name}={raw!r}: unknown fault point; known: {', '.join(POINTS)}")
        return cls(point, int(nth) if nth else 1, hang=name == HANG_ENV)

    def hit(self, point: str) -> None:
        """Die (or hang) here if this is the planned pass through `point`."""
        if point != self.point:
            return
        with self._lock:
            self._seen += 1
            if self._seen != self.nth:
                return
        if self.hang:
            threading.Event().wait(HANG_S)
        else:
            os.kill(os.getpid(), signal.SIGKILL)
