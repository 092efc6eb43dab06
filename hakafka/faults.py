"""Fault points for fault-injection tests: die or hang at a named step of the protocol.

`HAKAFKA_CRASH_AT=<point>[:<n>]` makes the n-th (default first) pass through that point kill
the process with SIGKILL, as a power cut would. `HAKAFKA_HANG_AT=<point>[:<n>]` makes the
thread that passes there block instead (for an hour), as on a hung disk or driver, and
`HAKAFKA_RAISE_AT=<point>[:<n>]` makes it raise `InjectedFaultError`, as a bug would. Unset
(always, in production) a point costs one comparison. The points are the steps whose
interleaving with a fault the exactly-once protocol must survive. A lane process inherits
the environment, so a point it passes counts its own passes.
"""

from __future__ import annotations

import os
import signal
import threading
from dataclasses import dataclass, field
from enum import StrEnum

ENV = "HAKAFKA_CRASH_AT"
HANG_ENV = "HAKAFKA_HANG_AT"
RAISE_ENV = "HAKAFKA_RAISE_AT"
HANG_S = 3600.0
POINTS = (
    "recover.after_replay",  # a new leader replayed its WAL, not yet consuming
    "lane.decode",  # a lane is about to decode a polled batch
    "consume.after_wal",  # a batch is in the WAL, not yet in the buffer
    "flush.after_pending",  # the intent is in ZooKeeper, nothing inserted
    "flush.after_insert",  # ClickHouse has the block, the checkpoint did not move
    "flush.after_checkpoint",  # checkpoint moved, WAL not yet truncated
)


class InjectedFaultError(RuntimeError):
    """Raised at a fault point by `HAKAFKA_RAISE_AT`."""


class Fault(StrEnum):
    """What a fault point does on its planned pass, and the variable that plans it."""

    KILL = ENV
    HANG = HANG_ENV
    RAISE = RAISE_ENV


@dataclass
class CrashPlan:
    """Where to fault: `point` (None: nowhere), on its `nth` pass, and how."""

    point: str | None
    nth: int = 1
    fault: Fault = Fault.KILL
    _seen: int = field(default=0, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    @classmethod
    def from_environment(cls) -> CrashPlan:
        """The plan in $HAKAFKA_CRASH_AT, $HAKAFKA_HANG_AT or $HAKAFKA_RAISE_AT (at most one
        of them)."""
        set_vars = [fault for fault in Fault if os.environ.get(fault.value)]
        if not set_vars:
            return cls(None)
        if len(set_vars) > 1:
            raise ValueError(f"set only one of {', '.join(Fault)}")
        fault = set_vars[0]
        raw = os.environ[fault.value]
        point, _, nth = raw.partition(":")
        if point not in POINTS:
            raise ValueError(f"{fault}={raw!r}: unknown fault point; known: {', '.join(POINTS)}")
        return cls(point, int(nth) if nth else 1, fault)

    def hit(self, point: str) -> None:
        """Die, hang or raise here if this is the planned pass through `point`."""
        if point != self.point:
            return
        with self._lock:
            self._seen += 1
            if self._seen != self.nth:
                return
        if self.fault is Fault.HANG:
            threading.Event().wait(HANG_S)
        elif self.fault is Fault.RAISE:
            raise InjectedFaultError(f"{RAISE_ENV} planned a fault at {point} (pass {self.nth})")
        else:
            os.kill(os.getpid(), signal.SIGKILL)
