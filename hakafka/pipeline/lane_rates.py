"""What each consume lane of a pipeline reads, and how fast: the rows it stored since the
pipeline started reading (its term began, or it restarted) and its rate over the last few
seconds, as `status`, `/status` and the status page show them."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

# Rows/s is the rate over this window: long enough to smooth a poll's burst, short enough
# that a lane that stops reads as stopped within seconds.
RATE_WINDOW_S = 10.0
SAMPLE_EVERY_S = 1.0


@dataclass(frozen=True)
class LaneView:
    """One lane as status shows it."""

    lane: int
    partitions: list[int]
    rows: int  # stored since the pipeline started reading
    rows_per_s: float  # over the last RATE_WINDOW_S (or since it started, if less)
    lag: int | None  # messages behind over its partitions; None before the first fetch


@dataclass
class LaneRates:
    """Rows stored per lane and their recent rate; used by the pipeline thread only, read
    (as `views`) by any thread: each view is built from values copied under the GIL."""

    window_s: float = RATE_WINDOW_S
    _rows: dict[int, int] = field(default_factory=dict, init=False)
    _samples: deque[tuple[float, dict[int, int]]] = field(default_factory=deque, init=False)

    def stored(self, lane: int, rows: int) -> None:
        """`lane` stored `rows` more rows."""
        self._rows[lane] = self._rows.get(lane, 0) + rows

    def sample(self, now: float | None = None) -> None:
        """Take a sample for the rate (at most one per SAMPLE_EVERY_S; older than the window
        dropped, but one kept at or before its start)."""
        now = time.monotonic() if now is None else now
        samples = self._samples
        if samples and now - samples[-1][0] < SAMPLE_EVERY_S:
            return
        samples.append((now, dict(self._rows)))
        while len(samples) > 2 and now - samples[1][0] >= self.window_s:
            samples.popleft()

    def views(
        self, partitions: list[list[int]], lag: dict[int, int], now: float | None = None
    ) -> list[LaneView]:
        """One view per lane of `partitions` (the partitions each lane reads, by lane), with
        its share of `lag`. The rate runs from the last sample at least a window old (the
        first, if none is) to now, so a lane whose thread is held (a full buffer) falls
        toward 0, never stays up."""
        now = time.monotonic() if now is None else now
        rows, samples = dict(self._rows), list(self._samples)
        since = next((s for s in reversed(samples) if now - s[0] >= self.window_s), None)
        if since is None and samples:
            since = samples[0]
        rates: dict[int, float] = {}
        if since is not None and now > since[0]:
            t0, first = since
            rates = {lane: (n - first.get(lane, 0)) / (now - t0) for lane, n in rows.items()}
        return [
            LaneView(
                i,
                ps,
                rows.get(i, 0),
                round(rates.get(i, 0.0), 1),
                sum(lag[p] for p in ps) if all(p in lag for p in ps) else None,
            )
            for i, ps in enumerate(partitions)
        ]
