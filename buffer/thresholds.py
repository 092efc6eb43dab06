"""Flush thresholds with the min/max semantics of HaKafka and ClickHouse's Buffer engine."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BufferStats:
    """What the flush decision looks at: the open (not yet sealed) part of a buffer.

    ``oldest_append`` is the monotonic time of the first append into the open part, or
    None when the open part is empty.
    """

    rows: int
    nbytes: int
    oldest_append: float | None


@dataclass(frozen=True)
class Thresholds:
    """Flush when every min threshold is passed, or when any max threshold is reached.

    A threshold left at None takes no part: a missing min counts as passed, a missing max
    never fires; with no min set at all only the max thresholds fire. Ages are seconds
    since the first append into the open part.
    """

    min_rows: int | None = None
    max_rows: int | None = None
    min_bytes: int | None = None
    max_bytes: int | None = None
    min_age_s: float | None = None
    max_age_s: float | None = None

    def __post_init__(self) -> None:
        for kind in ("rows", "bytes", "age_s"):
            low: float | None = getattr(self, f"min_{kind}")
            high: float | None = getattr(self, f"max_{kind}")
            for name, value in ((f"min_{kind}", low), (f"max_{kind}", high)):
                if value is not None and value < 0:
                    raise ValueError(f"Thresholds.{name} must be >= 0, got {value}")
            if low is not None and high is not None and low > high:
                raise ValueError(f"Thresholds.min_{kind} ({low}) exceeds max_{kind} ({high})")


def should_flush(thresholds: Thresholds, stats: BufferStats, now: float) -> bool:
    """True when the open part should be sealed and flushed; never true when it is empty."""
    if stats.rows == 0 or stats.oldest_append is None:
        return False
    age = now - stats.oldest_append
    measured = ((stats.rows, "rows"), (stats.nbytes, "bytes"), (age, "age_s"))
    for value, kind in measured:
        high: float | None = getattr(thresholds, f"max_{kind}")
        if high is not None and value >= high:
            return True
    mins = [(value, getattr(thresholds, f"min_{kind}")) for value, kind in measured]
    if all(low is None for _, low in mins):
        return False
    return all(low is None or value >= low for value, low in mins)
