"""ZooKeeper coordination for hakafka: node registry, replacement flags, one leader per shard
with a fencing epoch, fenced checkpoints and flush intents, and ops failover.

The daemon uses the `Coordinator` facade; everything else here is its parts.
"""

from hakafka.coordination.cluster_settings import SettingsStore
from hakafka.coordination.coordinator import Coordinator
from hakafka.coordination.election import Leadership
from hakafka.coordination.errors import (
    CoordinationError,
    FailoverRefused,
    FencedError,
    ZooKeeperUnavailableError,
)
from hakafka.coordination.fenced import FencedState
from hakafka.coordination.leadership_events import (
    BecameLeader,
    Correction,
    FailoverRequested,
    LeadershipEvent,
    LeadershipState,
    LostLeadership,
    Resumed,
    Suspended,
)
from hakafka.coordination.records import (
    Checkpoint,
    ClusterSettings,
    DrainedInfo,
    FailoverRequest,
    HeldBy,
    LeaderInfo,
    NodeInfo,
    OffsetRanges,
    PauseRecord,
    PendingIntent,
    PinRecord,
    PipelineSettings,
    ReplacingInfo,
    ReshardRequest,
    TaskRecord,
)
from hakafka.coordination.session import ZkConfig, ZkTls

__all__ = [
    "BecameLeader",
    "Checkpoint",
    "ClusterSettings",
    "CoordinationError",
    "Coordinator",
    "Correction",
    "DrainedInfo",
    "FailoverRefused",
    "FailoverRequest",
    "FailoverRequested",
    "FencedError",
    "FencedState",
    "HeldBy",
    "LeaderInfo",
    "Leadership",
    "LeadershipEvent",
    "LeadershipState",
    "LostLeadership",
    "NodeInfo",
    "OffsetRanges",
    "PauseRecord",
    "PendingIntent",
    "PinRecord",
    "PipelineSettings",
    "ReplacingInfo",
    "ReshardRequest",
    "Resumed",
    "SettingsStore",
    "Suspended",
    "TaskRecord",
    "ZkConfig",
    "ZkTls",
    "ZooKeeperUnavailableError",
]
