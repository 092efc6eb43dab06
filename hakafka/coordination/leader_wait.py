"""Ask a shard's leader, waiting for the next one when the current one does not answer.

Between a leader's death and its session's expiry, `leader` still names it; a caller that
gives up at the first refused connection fails for the whole failover window. `ask_leader`
re-reads `leader` and asks again until one answers or `wait_s` passes (a recipe: the
reader and the question are passed in; the question raises `LeaderNotAnswering` when the
leader did not answer, or cannot be asked yet).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from hakafka.coordination.errors import CoordinationError
from hakafka.coordination.records import LeaderInfo

T = TypeVar("T")
POLL_S = 0.25


class LeaderNotAnswering(Exception):  # noqa: N818 (a signal to ask again, not a failure)
    """Raised by `ask`: the leader did not answer (connection refused or dropped), is not
    registered, or cannot be asked yet; the text says which."""


class LeaderUnavailableError(CoordinationError):
    """No leader of the shard answered within the wait; the text names the shard and the
    last reason (no leader, or its leader did not answer)."""


def ask_leader(
    shard: int,
    leader_of: Callable[[int], LeaderInfo | None],
    ask: Callable[[LeaderInfo], T],
    *,
    wait_s: float,
) -> T:
    """`ask(leader)` for `shard`'s current leader. While the shard has no leader, or `ask`
    raises `LeaderNotAnswering`, `leader` is read again every 0.25 s; past `wait_s`
    LeaderUnavailableError. Any other exception from `ask` (the leader answered with an
    error) propagates at once."""
    deadline = time.monotonic() + wait_s
    while True:
        leader = leader_of(shard)
        if leader is None:
            last = "it has no leader"
        else:
            try:
                return ask(leader)
            except LeaderNotAnswering as exc:
                last = f"its leader {leader.node} (epoch {leader.epoch}) does not answer: {exc}"
        left = deadline - time.monotonic()
        if left <= 0:
            raise LeaderUnavailableError(
                f"shard {shard}: {last}; no next leader answered within {wait_s:g} s"
            )
        time.sleep(min(POLL_S, left))
