"""wal: a standalone write-ahead log of CRC-32C framed records in rolling segment files.

Public API: WriteAheadLog (open/append/sync/replay/truncate_before/segments/close), Position,
Record, RecordType, FsyncPolicy, RepairReport, the errors, and scan_log for read-only checks.
"""

from wal.errors import SegmentDamageError, WalClosedError, WalError, WalLockedError
from wal.fsync import FsyncPolicy
from wal.log import DEFAULT_SEGMENT_BYTES, WalConfig, WalStats, WriteAheadLog
from wal.record import MAX_HEADER_BYTES, MAX_PAYLOAD_BYTES, Position, Record, RecordType
from wal.repair import Corruption, LogScan, RepairReport, SegmentScan, TornTail, scan_log
from wal.segment import SegmentInfo

__all__ = [
    "DEFAULT_SEGMENT_BYTES",
    "MAX_HEADER_BYTES",
    "MAX_PAYLOAD_BYTES",
    "Corruption",
    "FsyncPolicy",
    "LogScan",
    "Position",
    "Record",
    "RecordType",
    "RepairReport",
    "SegmentDamageError",
    "SegmentInfo",
    "SegmentScan",
    "TornTail",
    "WalClosedError",
    "WalConfig",
    "WalError",
    "WalLockedError",
    "WalStats",
    "WriteAheadLog",
    "scan_log",
]
