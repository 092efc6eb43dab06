"""What a shard's `Leadership` (`election.py`) reports: its state, the events its listeners
receive in order, and the corrections its read-backs make (the `action` label of a metric)."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

from hakafka.coordination.records import FailoverRequest


class Correction(enum.StrEnum):
    """What a read-back found wrong and fixed (the `action` label of the metric)."""

    ADOPTED_LEADER = "adopted_leader"
    """`leader` was this session's while the node followed: the election went through."""
    DELETED_LEADER = "deleted_leader"
    """`leader` was this session's while the node must not lead: deleted."""
    DELETED_CANDIDATE = "deleted_candidate"
    """A second candidate of this session (a create whose reply was lost): deleted."""
    DROPPED_LEADERSHIP = "dropped_leadership"
    """The node believed it led but `leader` or `epoch` said otherwise."""
    DROPPED_SUSPENDED = "dropped_suspended"
    """Suspended for a session timeout on a live connection that could not confirm it."""


class LeadershipState(enum.Enum):
    FOLLOWER = "follower"
    LEADER = "leader"
    SUSPENDED = "suspended"
    """Was leading when the connection dropped: no side effects until Resumed or Lost."""


@dataclass(frozen=True)
class BecameLeader:
    epoch: int
    token: int
    at: float = field(default_factory=time.time, compare=False)
    """Unix time of the state change (every event has one)."""


@dataclass(frozen=True)
class LostLeadership:
    reason: str
    at: float = field(default_factory=time.time, compare=False)


@dataclass(frozen=True)
class Suspended:
    """The ZooKeeper connection dropped while leading: stop side effects now."""

    at: float = field(default_factory=time.time, compare=False)


@dataclass(frozen=True)
class Resumed:
    """The same session came back and the epoch is still ours: side effects may go on."""

    epoch: int
    token: int
    at: float = field(default_factory=time.time, compare=False)


@dataclass(frozen=True)
class FailoverRequested:
    """Ops asked this leader to hand over: finish or abandon the flush, then `resign()`."""

    request: FailoverRequest
    at: float = field(default_factory=time.time, compare=False)


LeadershipEvent = BecameLeader | LostLeadership | Suspended | Resumed | FailoverRequested
