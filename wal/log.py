"""WriteAheadLog: one directory of segments, its lock, rolling, fsync policy, replay, truncation."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Self

from wal.errors import WalClosedError
from wal.fsync import FsyncPolicy, IntervalSyncer
from wal.lock import DirectoryLock
from wal.record import FRAME_BYTES, Position, Record, RecordType, check_sizes
from wal.repair import RepairReport, repair
from wal.segment import (
    SegmentInfo,
    SegmentWriter,
    fsync_dir,
    list_segments,
    read_records,
    record_starts_at,
)

DEFAULT_SEGMENT_BYTES = 64 << 20
DEFAULT_INTERVAL_MS = 100


@dataclass(frozen=True)
class WalConfig:
    """How a log is written. `segment_bytes` is the size at which a new segment is started."""

    fsync: FsyncPolicy = FsyncPolicy.BATCH
    segment_bytes: int = DEFAULT_SEGMENT_BYTES
    interval_ms: int = DEFAULT_INTERVAL_MS

    def __post_init__(self) -> None:
        if self.segment_bytes < FRAME_BYTES:
            raise ValueError(
                f"WAL segment_bytes must be >= {FRAME_BYTES}, got {self.segment_bytes}"
            )
        if self.interval_ms <= 0:
            raise ValueError(f"WAL interval_ms must be > 0, got {self.interval_ms}")


@dataclass(frozen=True)
class WalStats:
    """Counters since open: records and bytes appended, fdatasyncs of segment data."""

    appends: int
    bytes: int
    syncs: int


class WriteAheadLog:
    """An append-only log of records in one directory, written by one process at a time.

    Records are appended to the active (last) segment; a new segment starts when the next
    record would take the active one past `segment_bytes` (a record never spans segments, so a
    record larger than that gets a segment of its own). The active segment has `segment_bytes`
    reserved on disk where the file system allows it; a sealed or closed one gives back what it
    did not use. Methods may be called from several threads; appends are serialised.
    """

    def __init__(self, directory: Path, config: WalConfig) -> None:
        """Use WriteAheadLog.open()."""
        self.directory = directory
        self.config = config
        self._mutex = threading.Lock()
        self._lock = DirectoryLock(directory)
        self._failure: BaseException | None = None
        self._closed = False
        self._appends = 0
        self._bytes = 0
        self._syncs = 0
        self._synced_appends = 0
        self._syncer: IntervalSyncer | None = None
        try:
            self.repair_report: RepairReport = repair(directory)
            existing = list_segments(directory)
            if existing:
                self._writer = SegmentWriter(
                    directory, existing[-1].index, create=False, reserve_bytes=config.segment_bytes
                )
            else:
                self._writer = SegmentWriter(
                    directory, 0, create=True, reserve_bytes=config.segment_bytes
                )
                fsync_dir(directory)
        except BaseException:
            self._lock.release()
            raise
        if config.fsync is FsyncPolicy.INTERVAL:
            self._syncer = IntervalSyncer(
                self.sync, config.interval_ms / 1000, f"wal-sync:{directory.name}"
            )

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        fsync: FsyncPolicy | str = FsyncPolicy.BATCH,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        interval_ms: int = DEFAULT_INTERVAL_MS,
    ) -> WriteAheadLog:
        """Open (creating if needed) the log in directory `path` for writing.

        Takes the directory lock (WalLockedError at once if another writer has it), then scans
        every record and repairs damage as described in wal.repair; `repair_report` says what
        was found. Raises ValueError for an unknown fsync policy or bad sizes.
        """
        directory = Path(path)
        directory.mkdir(parents=True, exist_ok=True)
        try:
            policy = FsyncPolicy(fsync)
        except ValueError:
            choices = ", ".join(p.value for p in FsyncPolicy)
            raise ValueError(f"WAL fsync policy {fsync!r} is not one of: {choices}") from None
        return cls(directory, WalConfig(policy, segment_bytes, interval_ms))

    def append(
        self,
        header: bytes,
        payload: bytes | bytearray | memoryview,
        record_type: RecordType = RecordType.FULL,
    ) -> Position:
        """Append one record and return its position (positions only ever increase).

        `header` is small caller-encoded bytes (<= MAX_HEADER_BYTES); `payload` is any
        C-contiguous buffer (e.g. a pyarrow Buffer via memoryview), written without a copy. With
        the `always` policy the record is durable when this returns.
        """
        view = memoryview(payload).cast("B")
        check_sizes(header, view)
        size = FRAME_BYTES + len(header) + view.nbytes
        with self._mutex:
            self._check_usable()
            try:
                writer = self._writer
                if writer.size > 0 and writer.size + size > self.config.segment_bytes:
                    writer = self._roll()
                position = writer.append(record_type, header, view)
                self._appends += 1
                self._bytes += size
                if self.config.fsync is FsyncPolicy.ALWAYS:
                    writer.datasync()
                    self._syncs += 1
                    self._synced_appends = self._appends
            except BaseException as exc:
                self._failure = exc
                raise
        return position

    def _roll(self) -> SegmentWriter:
        """Seal the active segment (durable unless policy OFF) and start the next one."""
        old = self._writer
        if self.config.fsync is not FsyncPolicy.OFF and self._synced_appends < self._appends:
            old.datasync()
            self._syncs += 1
            self._synced_appends = self._appends
        self._writer = SegmentWriter(
            self.directory, old.index + 1, create=True, reserve_bytes=self.config.segment_bytes
        )
        old.close()
        fsync_dir(self.directory)
        return self._writer

    def sync(self) -> None:
        """Make every record appended so far durable: at most one fdatasync, none if clean.

        Appends from other threads may go on while the fdatasync runs.
        """
        with self._mutex:
            self._check_usable()
            if self._synced_appends == self._appends:
                return
            target = self._appends
            fd = os.dup(self._writer.fd)
        try:
            os.fdatasync(fd)
        except BaseException as exc:
            self._failure = exc
            raise
        finally:
            os.close(fd)
        with self._mutex:
            self._syncs += 1
            self._synced_appends = max(self._synced_appends, target)

    def replay(self, start: Position | None = None) -> Iterator[Record]:
        """Yield records in order from `start` (default: the oldest kept record).

        Yields what was appended before the call; memory use is one record at a time. A `start`
        before the oldest segment starts at the oldest record; a `start` that is not a record
        boundary raises ValueError. Damage that appeared after open raises SegmentDamageError
        (naming file and byte offset) at that point; no record after it is yielded.
        """
        with self._mutex:
            self._check_usable()
            active = self._writer.index
            active_end = self._writer.size
        begin = start or Position(0, 0)
        for info in list_segments(self.directory):
            if info.index < begin.segment or info.index > active:
                continue
            offset = begin.offset if info.index == begin.segment else 0
            if offset and not record_starts_at(info.path, offset):
                raise ValueError(f"WAL position {begin} is not a record boundary in {info.path}")
            end = active_end if info.index == active else None
            yield from read_records(info.path, info.index, offset, end)

    def truncate_before(self, position: Position) -> list[Path]:
        """Delete whole segments with an index below `position.segment`, never the active one.

        Returns the deleted files (empty if none); deletion is made durable. Idempotent.
        """
        with self._mutex:
            self._check_usable()
            removed = []
            for info in list_segments(self.directory):
                if info.index >= min(position.segment, self._writer.index):
                    break
                info.path.unlink()
                removed.append(info.path)
            if removed:
                fsync_dir(self.directory)
            return removed

    def segments(self) -> list[SegmentInfo]:
        """The segment files now in the directory, oldest first; the last is the active one."""
        return list_segments(self.directory)

    @property
    def stats(self) -> WalStats:
        with self._mutex:
            return WalStats(self._appends, self._bytes, self._syncs)

    def close(self) -> None:
        """Sync (unless policy OFF), close the active segment and release the lock. Idempotent.

        Raises the error that made the log fail, if any, after releasing everything.
        """
        if self._closed:
            return
        if self._syncer is not None:
            self._syncer.stop()
        try:
            if self._failure is None and self.config.fsync is not FsyncPolicy.OFF:
                self.sync()
        finally:
            with self._mutex:
                self._closed = True
                self._writer.close()
            self._lock.release()
        self._check_failure()

    def _check_usable(self) -> None:
        if self._closed:
            raise WalClosedError(f"WAL {self.directory} is closed")
        self._check_failure()

    def _check_failure(self) -> None:
        failure = self._failure
        if failure is None and self._syncer is not None:
            failure = self._syncer.error
        if failure is not None:
            raise WalClosedError(
                f"WAL {self.directory} failed earlier ({failure!r}); reopen it to repair"
            ) from failure

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
