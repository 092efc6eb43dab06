"""The Arrow memory buffer: per-pipeline memory tables, flush thresholds, snapshots, sandboxed
SQL over snapshots and the Flight / HTTP query services. Standalone: never imports hakafka."""

from buffer.limits import QueryLimits
from buffer.snapshot import Snapshot
from buffer.sql import (
    Catalog,
    QueryError,
    QueryRefusedError,
    QueryTimeoutError,
    SqlEngine,
)
from buffer.table import (
    Block,
    BlockStateError,
    BufferFull,
    MemoryTable,
    OffsetOverlapError,
    OffsetRange,
)
from buffer.thresholds import BufferStats, Thresholds, should_flush

__all__ = [
    "Block",
    "BlockStateError",
    "BufferFull",
    "BufferStats",
    "Catalog",
    "MemoryTable",
    "OffsetOverlapError",
    "OffsetRange",
    "QueryError",
    "QueryLimits",
    "QueryRefusedError",
    "QueryTimeoutError",
    "Snapshot",
    "SqlEngine",
    "Thresholds",
    "should_flush",
]
