"""The one retry policy: its delays (first, doubling, maximum, jitter), the waiter's beats and
stop, and the retry loop's reports, give-ups and stop."""

from __future__ import annotations

import threading
import time

import pytest

from retry_policy import Backoff, Waiter


def test_delays_double_from_the_first_up_to_the_maximum() -> None:
    assert [Backoff(0.5, 10.0).delay(n) for n in range(1, 8)] == [0.5, 1, 2, 4, 8, 10, 10]
    assert Backoff(1.0, 30.0).delay(10_000) == 30.0  # no overflow however long it fails


def test_jitter_takes_at_most_its_fraction_off_each_delay() -> None:
    backoff = Backoff(1.0, 8.0, jitter=0.25)
    delays = [backoff.delay(4) for _ in range(200)]
    assert all(6.0 <= d <= 8.0 for d in delays)
    assert len(set(delays)) > 1
    with pytest.raises(ValueError, match="jitter"):
        Backoff(1.0, 8.0, jitter=1.5)


def test_the_waiter_beats_while_it_sleeps_and_a_stop_ends_the_sleep() -> None:
    stop, beats = threading.Event(), []
    waiter = Waiter(stop, lambda: beats.append(time.monotonic()), step=0.02)
    assert waiter.sleep(0.1)
    assert len(beats) >= 4
    threading.Timer(0.05, stop.set).start()
    began = time.monotonic()
    assert not waiter.sleep(10.0)
    assert time.monotonic() - began < 1.0


def test_the_waiter_waits_until_ready_or_stopped() -> None:
    stop, calls = threading.Event(), []

    def ready(timeout: float) -> bool:
        calls.append(timeout)
        return len(calls) == 3

    assert Waiter(stop, step=0.01).until(ready)
    assert calls == [0.01, 0.01, 0.01]
    stop.set()
    assert not Waiter(stop, step=0.01).until(lambda _timeout: False)


def test_call_retries_its_kind_reporting_each_failure_and_counts_the_attempts() -> None:
    outcomes: list[Exception | str] = [OSError("a"), OSError("b"), "done"]
    reported: list[tuple[str, int, float]] = []
    befores = []

    def attempt() -> str:
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    result = Backoff(0.01, 0.015).call(
        attempt,
        Waiter(threading.Event()),
        retry_on=OSError,
        stopped=lambda: AssertionError("not stopped"),
        before=lambda: befores.append(1),
        on_retry=lambda exc, n, delay: reported.append((str(exc), n, delay)),
    )
    assert result == ("done", 3)
    assert reported == [("a", 1, 0.01), ("b", 2, 0.015)]
    assert len(befores) == 3


def test_call_gives_up_on_other_kinds_and_raises_stopped_when_stopped() -> None:
    def refused() -> None:
        raise PermissionError("refused")

    with pytest.raises(PermissionError):
        Backoff(0.01, 0.01).call(
            refused,
            Waiter(threading.Event()),
            retry_on=OSError,
            give_up_on=(PermissionError,),
            stopped=lambda: AssertionError("not stopped"),
        )
    stop = threading.Event()
    stop.set()
    with pytest.raises(InterruptedError, match="stopped while retrying"):
        Backoff(0.01, 0.01).call(
            refused,
            Waiter(stop),
            retry_on=OSError,
            stopped=lambda: InterruptedError("stopped while retrying"),
        )
