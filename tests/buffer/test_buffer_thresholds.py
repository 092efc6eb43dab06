"""Flush thresholds: all mins passed, or any max reached (HaKafka / ClickHouse Buffer engine)."""

from __future__ import annotations

import pytest

from buffer import BufferStats, Thresholds, should_flush

NOW = 1000.0


def stats(rows: int, nbytes: int, age: float) -> BufferStats:
    return BufferStats(rows=rows, nbytes=nbytes, oldest_append=NOW - age)


MINS = Thresholds(min_rows=100, min_bytes=1000, min_age_s=10.0)


@pytest.mark.parametrize(
    ("rows", "nbytes", "age", "expected"),
    [
        (100, 1000, 10.0, True),  # every min exactly reached
        (99, 1000, 10.0, False),  # rows short
        (100, 999, 10.0, False),  # bytes short
        (100, 1000, 9.9, False),  # age short
        (5000, 50_000, 1.0, False),  # two far past, one short: still no flush
    ],
)
def test_min_thresholds_must_all_pass(rows: int, nbytes: int, age: float, expected: bool) -> None:
    assert should_flush(MINS, stats(rows, nbytes, age), NOW) is expected


@pytest.mark.parametrize(
    ("thresholds", "below", "at"),
    [
        (Thresholds(max_rows=500), stats(499, 10, 0.0), stats(500, 10, 0.0)),
        (Thresholds(max_bytes=4096), stats(1, 4095, 0.0), stats(1, 4096, 0.0)),
        (Thresholds(max_age_s=5.0), stats(1, 10, 4.9), stats(1, 10, 5.0)),
    ],
)
def test_any_single_max_fires_alone(
    thresholds: Thresholds, below: BufferStats, at: BufferStats
) -> None:
    assert not should_flush(thresholds, below, NOW)
    assert should_flush(thresholds, at, NOW)


BOTH = Thresholds(
    min_rows=100, max_rows=1000, min_bytes=1000, max_bytes=1 << 20, min_age_s=10.0, max_age_s=60.0
)


@pytest.mark.parametrize(
    ("at", "below"),
    [
        (stats(1000, 10, 0.0), stats(999, 10, 0.0)),
        (stats(1, 1 << 20, 0.0), stats(1, (1 << 20) - 1, 0.0)),
        (stats(1, 10, 60.0), stats(1, 10, 59.9)),
    ],
)
def test_any_max_overrides_unmet_mins(at: BufferStats, below: BufferStats) -> None:
    assert should_flush(BOTH, at, NOW)
    assert not should_flush(BOTH, below, NOW)


@pytest.mark.parametrize(
    ("rows", "nbytes", "age", "expected"),
    [
        (100, 1000, 10.0, True),  # every min exactly met, every max far off
        (999, (1 << 20) - 1, 59.9, True),  # every min passed, every max just short
        (99, 1000, 10.0, False),  # rows short, no max reached
        (100, 999, 10.0, False),  # bytes short, no max reached
        (100, 1000, 9.9, False),  # age short, no max reached
    ],
)
def test_mins_still_flush_when_maxes_are_set(
    rows: int, nbytes: int, age: float, expected: bool
) -> None:
    assert should_flush(BOTH, stats(rows, nbytes, age), NOW) is expected


MIXED = Thresholds(min_rows=100, min_bytes=1000, max_age_s=5.0)


@pytest.mark.parametrize(
    ("rows", "nbytes", "age", "expected"),
    [
        (100, 1000, 0.0, True),  # both mins met; the unset min_age counts as passed
        (99, 1000, 4.9, False),  # a min short, the max not reached
        (99, 1000, 5.0, True),  # the max on another measure fires despite it
        (100, 999, 4.9, False),
    ],
)
def test_mins_on_some_measures_max_on_another(
    rows: int, nbytes: int, age: float, expected: bool
) -> None:
    assert should_flush(MIXED, stats(rows, nbytes, age), NOW) is expected


@pytest.mark.parametrize(
    "thresholds",
    [
        Thresholds(min_rows=10),
        Thresholds(min_bytes=10),
        Thresholds(min_age_s=0.0),
    ],
)
def test_single_min_with_others_unset(thresholds: Thresholds) -> None:
    assert should_flush(thresholds, stats(10, 10, 0.0), NOW)
    assert should_flush(thresholds, stats(9, 9, 0.0), NOW) is (thresholds.min_age_s is not None)


def test_no_min_set_means_only_max_fires() -> None:
    assert not should_flush(Thresholds(max_rows=100), stats(99, 10**9, 10**6), NOW)
    assert not should_flush(Thresholds(), stats(10**9, 10**9, 10**6), NOW)


def test_empty_buffer_never_flushes() -> None:
    t = Thresholds(min_rows=0, max_rows=0, max_age_s=0.0)
    assert not should_flush(t, BufferStats(rows=0, nbytes=0, oldest_append=None), NOW)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"min_rows": 10, "max_rows": 5}, "min_rows (10) exceeds max_rows (5)"),
        ({"min_bytes": 2, "max_bytes": 1}, "min_bytes (2) exceeds max_bytes (1)"),
        ({"min_age_s": 3.0, "max_age_s": 1.0}, "min_age_s (3.0) exceeds max_age_s (1.0)"),
        ({"max_rows": -1}, "Thresholds.max_rows must be >= 0, got -1"),
    ],
)
def test_invalid_thresholds_are_refused(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Thresholds(**kwargs)  # type: ignore[arg-type]
