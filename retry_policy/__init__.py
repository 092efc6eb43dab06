"""retry_policy: the one retry policy of every retry loop (the daemon's and `chlib`'s).

A `Backoff` says how long to wait before each retry: its first delay, doubling up to its
maximum, less a random part (`jitter`) when many clients should not retry in step. A `Waiter`
waits the way a watched thread must: in short steps, calling `beat` at each one (a stall
detector sees the thread alive), and ending at once when `stop` is set. `Backoff.call` is the
loop most retries are: call, and after a failure of a retried kind, report it and wait.

Loops that keep their own clock use `Backoff.delay` alone: a supervisor that restarts
something on its own tick, a failover with its own time budget, a refresh on a schedule.

Stands alone (standard library only), so `hakafka` and the libraries may all use it.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

__all__ = ["Backoff", "Waiter"]

T = TypeVar("T")
E = TypeVar("E", bound=Exception)

# Past this many doublings every delay is the maximum anyway; the cap keeps 2 ** n finite.
_MAX_DOUBLINGS = 64


def _nothing() -> None:
    """A beat that tells no one: for waits nothing watches."""


@dataclass(frozen=True)
class Waiter:
    """How a thread waits between attempts: in steps of at most `step` seconds, calling
    `beat` at each one, and never past `stop` being set."""

    stop: threading.Event
    beat: Callable[[], None] = _nothing
    step: float = 0.2

    def sleep(self, seconds: float) -> bool:
        """Wait `seconds`, beating; False as soon as `stop` is set, True once they passed."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            self.beat()
            if self.stop.wait(min(left, self.step)):
                return False
        return True

    def until(self, ready: Callable[[float], bool]) -> bool:
        """Wait until `ready(timeout)` (which waits up to `timeout` seconds for its condition
        and says whether it holds) is True, beating between its calls; False if `stop` is set
        first (checked after each call that came back False)."""
        while not ready(self.step):
            self.beat()
            if self.stop.is_set():
                return False
        return True


@dataclass(frozen=True)
class Backoff:
    """The delays between attempts: `first`, doubling up to `maximum`, with `jitter`."""

    first: float
    """Seconds before the first retry."""
    maximum: float
    """The longest delay: the doubling stops there."""
    jitter: float = 0.0
    """Up to this fraction of each delay (0 to 1) is taken off at random, so that clients
    failing together do not retry together; 0 keeps the delays exact."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.jitter <= 1.0:
            raise ValueError(f"jitter must be within 0 and 1, not {self.jitter}")

    def delay(self, attempt: int) -> float:
        """Seconds to wait before retry number `attempt` (1-based: after that many failures):
        `first` doubled `attempt - 1` times, at most `maximum`, less up to `jitter` of it."""
        exact = min(self.maximum, self.first * 2.0 ** min(attempt - 1, _MAX_DOUBLINGS))
        return exact - random.uniform(0.0, self.jitter * exact) if self.jitter else exact

    def call(
        self,
        attempt: Callable[[], T],
        waiter: Waiter,
        *,
        retry_on: type[E] | tuple[type[E], ...],
        stopped: Callable[[], Exception],
        give_up_on: tuple[type[Exception], ...] = (),
        before: Callable[[], None] = _nothing,
        on_retry: Callable[[E, int, float], None] | None = None,
    ) -> tuple[T, int]:
        """`attempt()`'s result and how many attempts it took, calling it until it returns.

        `before()` runs before every attempt (it may raise to end the loop). A failure of a
        `retry_on` kind that is not of a `give_up_on` kind is passed to `on_retry(error,
        attempt number, delay)` and waited out with `waiter` for `delay(attempt number)`;
        `stopped()` is raised if the waiter's `stop` is set meanwhile. Any other error, and
        any error `before` raises, propagates as it is."""
        attempts = 0
        while True:
            attempts += 1
            before()
            try:
                return attempt(), attempts
            except give_up_on:
                raise
            except retry_on as exc:
                error = exc
            delay = self.delay(attempts)
            if on_retry is not None:
                on_retry(error, attempts, delay)
            if not waiter.sleep(delay):
                raise stopped()
