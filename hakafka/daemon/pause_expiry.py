"""Pauses whose command died: `hakafka offsets set` and `pending drop` pause a pipeline with a
deadline for their own duration; a flag still there past its deadline means the command died
half-way, so the shard's leader resumes the pipeline (`pipeline.pause_expired`). An ops pause
(`hakafka pipeline pause`) has no deadline and stays until ops resume it."""

from __future__ import annotations

import time
from collections.abc import Iterable

from structlog.typing import FilteringBoundLogger

from hakafka.coordination.pause import PauseStore

PAUSE_CHECK_S = 2.0  # how often a leader reads its pause flags for a passed deadline


class PauseExpiry:
    """Resumes the pauses of one shard whose deadline passed, reading the flags at most every
    `PAUSE_CHECK_S`; a flag's deletion comes back through the pause watch and starts the
    pipeline."""

    def __init__(self, pauses: PauseStore, shard: int, log: FilteringBoundLogger) -> None:
        self._pauses, self._shard, self._log = pauses, shard, log
        self._checked = 0.0  # monotonic time the deadlines were last read

    def check(self, paused: Iterable[str], now: float) -> None:
        """Resume each of the `paused` pipelines whose pause deadline passed, unless the
        flags were read less than `PAUSE_CHECK_S` before `now` (monotonic time)."""
        names = sorted(paused)
        if not names or now - self._checked < PAUSE_CHECK_S:
            return
        self._checked = now
        for name in names:
            stored = self._pauses.read(self._shard, name)
            deadline = None if stored is None else stored.record.deadline
            if stored is None or deadline is None or time.time() < deadline:
                continue
            if self._pauses.resume_expired(self._shard, name, stored):
                self._log.error(
                    "pipeline.pause_expired",
                    pipeline=name,
                    by=stored.record.by,
                    reason=stored.record.reason,
                    deadline=deadline,
                    action="resumed: the command that paused it did not end it",
                )
