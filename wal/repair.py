"""Scanning a WAL directory for damage (read-only) and repairing it (on open).

Damage is classified so that no valid record is ever dropped silently:

- torn tail: the last segment ends inside its last record (the frame or body is cut short), or
  everything from the bad record to the end of the file is zero (space the file system
  allocated but the crash never filled). That record's append cannot have returned under the
  `always` policy; its bytes are truncated away and reported.
- corruption: anything else (CRC mismatch, impossible length, a short non-last segment, a missing
  segment). The damaged bytes to the end of that segment go to `<segment>.at-<offset>.corrupt`,
  every later segment is renamed to `<segment>.at-0.corrupt`, and the report names the segment
  and byte offset. Records before the damage stay; nothing at or after it is ever replayed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from wal.errors import SegmentDamageError
from wal.segment import (
    SegmentInfo,
    fsync_dir,
    is_zero_from,
    list_segments,
    quarantine_tail,
    quarantine_whole,
    read_records,
    segment_name,
    truncate_file,
)


@dataclass(frozen=True)
class TornTail:
    """An incomplete record at the end of the last segment."""

    segment: int
    path: str
    offset: int
    bytes_truncated: int
    reason: str


@dataclass(frozen=True)
class Corruption:
    """The first damaged place of the log; nothing from here on is replayed."""

    segment: int
    path: str
    offset: int
    reason: str


@dataclass(frozen=True)
class SegmentScan:
    """What a read-only scan found in one segment (up to its first damage)."""

    info: SegmentInfo
    records: int
    valid_bytes: int
    first_header: bytes | None
    last_header: bytes | None
    damage: SegmentDamageError | None


@dataclass(frozen=True)
class LogScan:
    """A read-only scan of a WAL directory.

    `segments` are the scanned segments (the damaged one last, if any); `unreachable` are the
    segments after the damage, which are never replayed.
    """

    segments: tuple[SegmentScan, ...]
    unreachable: tuple[SegmentInfo, ...]
    torn_tail: TornTail | None
    corruption: Corruption | None

    @property
    def records(self) -> int:
        """Valid records before any damage."""
        return sum(scan.records for scan in self.segments)


@dataclass(frozen=True)
class RepairReport:
    """What opening the log found and did. `clean` is True when there was nothing to repair."""

    records: int
    torn_tail: TornTail | None
    corruption: Corruption | None
    quarantined: tuple[str, ...]

    @property
    def clean(self) -> bool:
        return self.torn_tail is None and self.corruption is None


def scan_segment(info: SegmentInfo) -> SegmentScan:
    """CRC-check every record of one segment, stopping at the first damage."""
    records = 0
    valid_bytes = 0
    first_header: bytes | None = None
    last_header: bytes | None = None
    damage: SegmentDamageError | None = None
    try:
        for record in read_records(info.path, info.index):
            records += 1
            valid_bytes += record.size
            if first_header is None:
                first_header = record.header
            last_header = record.header
    except SegmentDamageError as exc:
        damage = exc
    return SegmentScan(info, records, valid_bytes, first_header, last_header, damage)


def scan_log(directory: Path) -> LogScan:
    """Scan every segment of `directory` in order without changing anything."""
    infos = list_segments(directory)
    scans: list[SegmentScan] = []
    for position, info in enumerate(infos):
        if scans and info.index != scans[-1].info.index + 1:
            missing = scans[-1].info.index + 1
            corruption = Corruption(
                missing,
                str(directory / segment_name(missing)),
                0,
                f"segment {missing} is missing (next present is {info.index})",
            )
            return LogScan(tuple(scans), tuple(infos[position:]), None, corruption)
        scan = scan_segment(info)
        scans.append(scan)
        if scan.damage is not None:
            damage = scan.damage
            is_last = position == len(infos) - 1
            if is_last and (damage.incomplete or is_zero_from(info.path, damage.offset)):
                torn = TornTail(
                    info.index,
                    str(info.path),
                    damage.offset,
                    info.size - damage.offset,
                    damage.reason if damage.incomplete else "zero-filled tail",
                )
                return LogScan(tuple(scans), (), torn, None)
            corruption = Corruption(info.index, str(info.path), damage.offset, damage.reason)
            return LogScan(tuple(scans), tuple(infos[position + 1 :]), None, corruption)
    return LogScan(tuple(scans), (), None, None)


def repair(directory: Path) -> RepairReport:
    """Scan `directory` and repair what the scan found; the caller must hold the lock."""
    scan = scan_log(directory)
    quarantined: list[str] = []
    if scan.torn_tail is not None:
        truncate_file(Path(scan.torn_tail.path), scan.torn_tail.offset)
    if scan.corruption is not None:
        damaged = scan.segments[-1] if scan.segments else None
        if damaged is not None and damaged.damage is not None:
            target = quarantine_tail(damaged.info.path, damaged.damage.offset)
            quarantined.append(target.name)
        quarantined.extend(quarantine_whole(info.path).name for info in scan.unreachable)
        fsync_dir(directory)
    return RepairReport(scan.records, scan.torn_tail, scan.corruption, tuple(quarantined))
