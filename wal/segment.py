"""One segment file: naming, appending, reading records back, and cutting off a damaged tail."""

from __future__ import annotations

import mmap
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from wal import reserve
from wal.errors import SegmentDamageError
from wal.record import (
    FRAME_BYTES,
    FrameError,
    Position,
    Record,
    RecordType,
    body_crc_matches,
    decode_frame,
    encode_frame,
)

SEGMENT_SUFFIX = ".wal"
CORRUPT_SUFFIX = ".corrupt"
_SEGMENT_NAME = re.compile(r"^(\d{20})\.wal$")
_COPY_CHUNK = 1 << 20
_MAX_NAME_TRIES = 1000


def segment_name(index: int) -> str:
    """File name of segment `index`: 20 zero-padded digits, so name order is segment order."""
    return f"{index:020d}{SEGMENT_SUFFIX}"


def parse_segment_name(name: str) -> int | None:
    """Segment index of a file name, or None if the name is not a segment's."""
    match = _SEGMENT_NAME.match(name)
    return int(match.group(1)) if match else None


@dataclass(frozen=True)
class SegmentInfo:
    """A segment file as it is on disk."""

    index: int
    path: Path
    size: int


def list_segments(directory: Path) -> list[SegmentInfo]:
    """Segments in `directory`, in index order (other files are ignored)."""
    found = []
    for entry in os.scandir(directory):
        index = parse_segment_name(entry.name)
        if index is not None and entry.is_file():
            found.append(SegmentInfo(index, Path(entry.path), entry.stat().st_size))
    return sorted(found, key=lambda info: info.index)


def fsync_dir(directory: Path) -> None:
    """Make creations, renames and removals of entries in `directory` durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class SegmentWriter:
    """The active segment, open for appending. Not thread-safe: the log serialises access."""

    def __init__(self, directory: Path, index: int, create: bool, reserve_bytes: int):
        """Open segment `index` for appending; with `create`, the file must not exist yet.

        The first `reserve_bytes` of the file are reserved on disk where the file system allows
        it (see wal.reserve); close() gives back what was not written.
        """
        self.index = index
        self.path = directory / segment_name(index)
        flags = os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC
        if create:
            flags |= os.O_CREAT | os.O_EXCL
        self.fd = os.open(self.path, flags, 0o644)
        self.size = os.fstat(self.fd).st_size
        self._reserved = reserve.reserve(self.fd, reserve_bytes)

    def append(self, record_type: RecordType, header: bytes, payload: memoryview) -> Position:
        """Write one record at the end of the file (no fsync) and return where it starts.

        `payload` must be a 1-D byte view (format "B").
        """
        frame = encode_frame(record_type, header, payload)
        position = Position(self.index, self.size)
        parts = [memoryview(frame), memoryview(header), payload]
        total = FRAME_BYTES + len(header) + payload.nbytes
        written = 0
        # writev may write less than asked (huge records, signals); finish the rest.
        while written < total:
            done = os.writev(self.fd, parts)
            written += done
            parts = _skip(parts, done)
        self.size += total
        return position

    def datasync(self) -> None:
        os.fdatasync(self.fd)

    def close(self) -> None:
        """Give back unwritten reserved blocks and close the file."""
        try:
            if self._reserved:
                reserve.release(self.fd)
        finally:
            os.close(self.fd)


def _skip(parts: list[memoryview], count: int) -> list[memoryview]:
    """`parts` (byte views) without their first `count` bytes."""
    rest = []
    for part in parts:
        if count >= part.nbytes:
            count -= part.nbytes
            continue
        rest.append(part[count:])
        count = 0
    return rest


def read_records(
    path: Path, index: int, start: int = 0, end: int | None = None
) -> Iterator[Record]:
    """Yield the valid records of a segment from byte `start` up to byte `end` (default: EOF).

    Every record is CRC-checked before it is yielded. At the first damaged record this raises
    SegmentDamageError with its offset; nothing after it is yielded. Payloads are views into a
    read-only memory map of the file (no copy); the map lives as long as any view of it, so
    memory use is the page cache, and a payload stays valid after the file is deleted.
    """
    with open(path, "rb") as file:
        size = os.fstat(file.fileno()).st_size
        limit = size if end is None else min(end, size)
        if start >= limit:
            return
        # Mapping only up to `limit` keeps every access inside the file.
        mapped = mmap.mmap(file.fileno(), limit, prot=mmap.PROT_READ)
    mapped.madvise(mmap.MADV_SEQUENTIAL)
    view = memoryview(mapped)
    offset = start
    while offset < limit:
        record = _read_one(view, path, index, offset)
        yield record
        offset += record.size


def _read_one(view: memoryview, path: Path, index: int, offset: int) -> Record:
    """The CRC-checked record at `offset` of a mapped segment."""

    def damage(reason: str, incomplete: bool) -> SegmentDamageError:
        return SegmentDamageError(str(path), index, offset, reason, incomplete)

    limit = view.nbytes
    if offset + FRAME_BYTES > limit:
        raise damage(f"file ends {limit - offset} bytes into a {FRAME_BYTES}-byte frame", True)
    try:
        frame = decode_frame(view, offset)
    except FrameError as exc:
        raise damage(str(exc), False) from None
    payload_start = offset + FRAME_BYTES + frame.header_len
    body_end = payload_start + frame.payload_len
    if body_end > limit:
        raise damage(f"record of {body_end - offset} bytes runs past the end at byte {limit}", True)
    if not body_crc_matches(view, offset, frame):
        raise damage("record CRC mismatch", False)
    return Record(
        Position(index, offset),
        frame.type,
        view[offset + FRAME_BYTES : payload_start].tobytes(),
        view[payload_start:body_end],
    )


def record_starts_at(path: Path, offset: int) -> bool:
    """True if walking the frames of a segment from byte 0 lands exactly on byte `offset`."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        position = 0
        while position < offset:
            frame = os.pread(fd, FRAME_BYTES, position)
            if len(frame) < FRAME_BYTES:
                return False
            try:
                fields = decode_frame(frame)
                position += FRAME_BYTES + fields.header_len + fields.payload_len
            except FrameError:
                return False
        return position == offset
    finally:
        os.close(fd)


def is_zero_from(path: Path, offset: int) -> bool:
    """True if every byte of the file from `offset` to its end is zero (unwritten space)."""
    with open(path, "rb", buffering=0) as file:
        file.seek(offset)
        buf = bytearray(_COPY_CHUNK)
        while True:
            count = file.readinto(buf)
            if not count:
                return True
            if buf[:count].count(0) != count:
                return False


def unique_path(path: Path) -> Path:
    """`path`, or `path` with a numeric suffix if a file of that name already exists."""
    candidate = path
    for number in range(2, _MAX_NAME_TRIES):
        if not candidate.exists():
            return candidate
        candidate = path.with_name(f"{path.name}.{number}")
    raise FileExistsError(f"no free name for {path} after {_MAX_NAME_TRIES} tries")


def quarantine_tail(path: Path, offset: int) -> Path:
    """Copy bytes from `offset` to the end into a new `*.corrupt` file, then cut them off.

    Returns the quarantine file. Both files are fsynced before the cut, so a crash in between
    leaves the damage in place to be found and quarantined again.
    """
    target = unique_path(path.with_name(f"{path.name}.at-{offset}{CORRUPT_SUFFIX}"))
    with open(path, "rb", buffering=0) as src, open(target, "xb", buffering=0) as dst:
        src.seek(offset)
        while chunk := src.read(_COPY_CHUNK):
            dst.write(chunk)
        os.fsync(dst.fileno())
    fsync_dir(path.parent)
    truncate_file(path, offset)
    return target


def quarantine_whole(path: Path) -> Path:
    """Rename a segment to `*.corrupt` (it follows damage) and return the new path."""
    target = unique_path(path.with_name(f"{path.name}.at-0{CORRUPT_SUFFIX}"))
    os.rename(path, target)
    return target


def truncate_file(path: Path, size: int) -> None:
    """Cut a file to `size` bytes and make that durable."""
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.ftruncate(fd, size)
        os.fsync(fd)
    finally:
        os.close(fd)
