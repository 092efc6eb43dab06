"""bench/security_bench.py: its refusal and slowloris figures count what their labels say,
against a real server in a child process (seconds each, no local stack)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from security_bench import (
    GOOD,
    HALF_REQUEST,
    REQUESTS,
    Served,
    ServeSpec,
    drive,
    refusal_rates,
    status_of,
)

from buffer.limits import ServerLimits

CONNECTIONS = 4
TIMEOUT_S = 0.5


@pytest.fixture
def served() -> Iterator[Served]:
    limits = ServerLimits(max_connections=CONNECTIONS, request_timeout=TIMEOUT_S)
    with Served(ServeSpec(servers=("http",), server_limits=limits)) as server:
        yield server


def test_status_of_reads_the_status_line_and_nothing_else() -> None:
    assert status_of(b"HTTP/1.1 413 Payload Too Large\r\nContent-Length: 0\r\n\r\n") == 413
    assert status_of(b"") == 0
    assert status_of(b"413 Payload Too Large") == 0


def test_every_refusal_is_timed_as_answered_with_its_status(served: Served) -> None:
    refusals = refusal_rates(served, block=3, rounds=2)
    assert sorted(refusals.rates) == sorted(kind for kind in REQUESTS if kind != GOOD)
    assert refusals.refused == 4 * 2 * 3
    for pairs in refusals.rates.values():
        assert len(pairs.base) == len(pairs.subject) == 2
        assert min(pairs.base + pairs.subject) > 0
    assert refusals.end.threads == refusals.warm.threads  # every handler ended


def test_half_sent_requests_hold_at_most_max_connections_handlers(served: Served) -> None:
    held = drive(served, 10, HALF_REQUEST, pace_s=0.002, limit_s=TIMEOUT_S + 10)
    assert held.unended == 0
    # Those over the cap are read by the overflow reader (no thread each) and dropped
    # after its 1 s, as the handlers drop theirs after the request timeout: no answer.
    statuses = sorted(status_of(e.answer) for e in held.ended)
    assert statuses == [0] * 10
    dropped = [e.answer_s for e in held.ended if e.answer == b""]
    assert all(TIMEOUT_S * 0.9 < s < TIMEOUT_S + 2 for s in dropped), dropped
    assert held.most.threads == held.before.threads + CONNECTIONS
    assert held.probe == 200  # a probe while they hold every handler is still answered
