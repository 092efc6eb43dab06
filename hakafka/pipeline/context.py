"""What the consume and flush lanes of one pipeline share."""

from __future__ import annotations

from dataclasses import dataclass

from structlog.typing import FilteringBoundLogger

from hakafka.config import PipelineConfig
from hakafka.faults import CrashPlan
from hakafka.pipeline.buffer import PipelineBuffer
from hakafka.pipeline.meters import PipelineMeters
from hakafka.pipeline.replay import WalIndex
from hakafka.pipeline.state import PipelineStatus, Signals


@dataclass(frozen=True)
class PipelineContext:
    """One pipeline's shared state: its config, buffer, WAL index, signals, status, meters,
    crash points and bound logger. Both lanes hold the same instance."""

    config: PipelineConfig
    buffer: PipelineBuffer
    index: WalIndex
    signals: Signals
    status: PipelineStatus
    meters: PipelineMeters
    crash: CrashPlan
    log: FilteringBoundLogger
