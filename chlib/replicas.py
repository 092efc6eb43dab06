"""Choosing a shard replica to write to: writable only, local first, healthy, with failover."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import structlog

from chlib.connection import Connection
from retry_policy import Backoff

log = structlog.get_logger("chlib.replicas")

T = TypeVar("T")


@dataclass(frozen=True)
class Replica:
    """One ClickHouse replica of the shard. `writable` is False while it is being replaced."""

    name: str
    host: str
    port: int
    local: bool = False
    writable: bool = True


@dataclass(frozen=True)
class RetryPolicy:
    """Bounds for writing one block: attempts, total time, backoff (the project's one
    `retry_policy.Backoff`, without jitter), health-check timeout."""

    max_attempts: int = 4
    time_budget: float = 120.0
    backoff_initial: float = 0.25
    backoff_max: float = 5.0
    health_timeout: float = 0.75

    def backoff(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number `attempt` (1-based)."""
        return Backoff(self.backoff_initial, self.backoff_max).delay(attempt)


class NoWritableReplicaError(Exception):
    """Every replica of the shard is marked not writable (or none was given)."""


@dataclass
class Attempt:
    replica: str
    error: str


class ReplicasExhaustedError(Exception):
    """All attempts failed within the policy's bounds; `attempts` says what happened where."""

    def __init__(self, attempts: list[Attempt], reason: str) -> None:
        self.attempts = attempts
        detail = "; ".join(f"{a.replica}: {a.error}" for a in attempts) or "no attempt made"
        super().__init__(f"{reason} ({detail})")


def write_order(replicas: Sequence[Replica]) -> list[Replica]:
    """The writable replicas, local ones first, otherwise in the given order."""
    writable = [r for r in replicas if r.writable]
    if not writable:
        names = [r.name for r in replicas]
        raise NoWritableReplicaError(f"no writable replica among {names}")
    return sorted(writable, key=lambda r: not r.local)


@dataclass
class Failover:
    """Runs an action against replicas in `write_order`, skipping unhealthy ones, retrying the
    next replica with exponential backoff until it succeeds or the policy's bounds are hit.
    An error of a `fatal` kind (one no replica or attempt can mend) ends it at once."""

    connection: Connection
    policy: RetryPolicy = field(default_factory=RetryPolicy)
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    fatal: tuple[type[Exception], ...] = ()

    def healthy(self, replica: Replica) -> bool:
        return self.connection.ping(replica.host, replica.port, self.policy.health_timeout)

    def run(
        self, replicas: Sequence[Replica], action: Callable[[Replica], T]
    ) -> tuple[T, Replica, int]:
        """``(result, replica, attempts)`` of the first successful ``action(replica)``.

        A replica failing its health check costs no attempt; a full round of unhealthy
        replicas counts as one failed attempt. Raises `ReplicasExhaustedError`, or the first
        error of a `fatal` kind as it is.
        """
        order = write_order(replicas)
        deadline = self.clock() + self.policy.time_budget
        attempts: list[Attempt] = []
        position = 0
        while len(attempts) < self.policy.max_attempts:
            replica = self._next_healthy(order, position, attempts)
            if replica is not None:
                position = order.index(replica) + 1
                try:
                    return action(replica), replica, len(attempts) + 1
                except self.fatal:
                    raise
                except Exception as exc:
                    attempts.append(Attempt(replica.name, f"{type(exc).__name__}: {exc}"[:500]))
                    log.warning("replica.write_failed", replica=replica.name, error=str(exc)[:200])
            wait = self.policy.backoff(len(attempts))
            if len(attempts) >= self.policy.max_attempts:
                break
            if self.clock() + wait > deadline:
                raise ReplicasExhaustedError(
                    attempts, f"time budget {self.policy.time_budget}s spent"
                )
            self.sleep(wait)
        raise ReplicasExhaustedError(attempts, f"{self.policy.max_attempts} attempts failed")

    def _next_healthy(
        self, order: list[Replica], start: int, attempts: list[Attempt]
    ) -> Replica | None:
        """The first healthy replica from `start` round-robin; None (and one failed attempt
        recorded) if none answers."""
        for step in range(len(order)):
            replica = order[(start + step) % len(order)]
            if self.healthy(replica):
                return replica
            log.info("replica.unhealthy", replica=replica.name)
        attempts.append(Attempt("*", f"no replica answered /ping: {[r.name for r in order]}"))
        return None
