"""Record framing: positions, record types, frame encode/decode and CRC-32C.

On-disk frame of one record (little-endian), followed by the header and payload bytes:

    offset size field
    0      1    type          (RecordType; 0 is never written, so zero-filled space is invalid)
    1      1    flags         (0; reserved)
    2      2    header_len    (<= MAX_HEADER_BYTES)
    4      4    payload_len   (<= MAX_PAYLOAD_BYTES)
    8      4    frame_crc     CRC-32C of bytes 0..8: a damaged length is detected before it is used
    12     4    crc           CRC-32C of bytes 0..12 + header + payload

A record never spans segments: a record larger than the segment size gets a segment of its own.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass
from typing import NamedTuple

from crc32c import crc32c

FRAME_BYTES = 16
MAX_HEADER_BYTES = 0xFFFF
MAX_PAYLOAD_BYTES = 1 << 30

_FIELDS = struct.Struct("<BBHI")
_CRC = struct.Struct("<I")
_FRAME = struct.Struct("<BBHIII")


class RecordType(enum.IntEnum):
    """Kind of a record. FULL is a complete data record (the only kind written today)."""

    FULL = 1


_TYPES = {member.value: member for member in RecordType}


@dataclass(frozen=True, order=True, slots=True)
class Position:
    """Where a record starts: segment index, then byte offset inside that segment."""

    segment: int
    offset: int

    def __str__(self) -> str:
        return f"{self.segment}:{self.offset}"


@dataclass(frozen=True, slots=True)
class Record:
    """One replayed record.

    `header` is a bytes copy. `payload` is a read-only memoryview into a read-only memory map of
    the segment file (no copy): it stays valid as long as it is referenced, also after the log
    is closed or the segment deleted (the map is released with its last view). Only a file cut
    shorter behind the log's back (not something the WAL does to returned records) could
    invalidate it. Use bytes(payload) for a private copy.
    """

    position: Position
    type: RecordType
    header: bytes
    payload: memoryview

    @property
    def size(self) -> int:
        """Bytes this record occupies on disk (frame, header and payload)."""
        return FRAME_BYTES + len(self.header) + self.payload.nbytes

    @property
    def end(self) -> Position:
        """Position just after this record, where the next one starts."""
        return Position(self.position.segment, self.position.offset + self.size)


class Frame(NamedTuple):
    """The decoded fixed-size frame of one record (a tuple: decoded once per record)."""

    type: RecordType
    header_len: int
    payload_len: int
    crc: int


class FrameError(ValueError):
    """The 16 bytes at a position are not a valid frame (bad frame CRC, type or length)."""


def check_sizes(header: bytes, payload: memoryview) -> None:
    """Raise ValueError if `header` or `payload` is larger than a record may hold."""
    if len(header) > MAX_HEADER_BYTES:
        raise ValueError(f"WAL record header is {len(header)} bytes, max {MAX_HEADER_BYTES}")
    if payload.nbytes > MAX_PAYLOAD_BYTES:
        raise ValueError(f"WAL record payload is {payload.nbytes} bytes, max {MAX_PAYLOAD_BYTES}")


def encode_frame(record_type: RecordType, header: bytes, payload: memoryview) -> bytes:
    """Return the 16-byte frame for `header` + `payload`; raises ValueError if either is too big."""
    check_sizes(header, payload)
    fields = _FIELDS.pack(int(record_type), 0, len(header), payload.nbytes)
    head = fields + _CRC.pack(crc32c(fields))
    crc = crc32c(payload, value=crc32c(header, value=crc32c(head)))
    return head + _CRC.pack(crc)


def decode_frame(buf: bytes | memoryview, offset: int = 0) -> Frame:
    """Decode the 16-byte frame at `offset` of `buf`; raises FrameError naming what is wrong."""
    type_code, flags, header_len, payload_len, frame_crc, crc = _FRAME.unpack_from(buf, offset)
    if crc32c(buf[offset : offset + 8]) != frame_crc:
        raise FrameError("frame CRC mismatch (damaged type or length fields)")
    record_type = _TYPES.get(type_code)
    if record_type is None or flags != 0:
        raise FrameError(f"unknown record type {type_code} / flags {flags}")
    if payload_len > MAX_PAYLOAD_BYTES:
        raise FrameError(f"impossible payload length {payload_len} (max {MAX_PAYLOAD_BYTES})")
    return Frame(record_type, header_len, payload_len, crc)


def body_crc_matches(buf: memoryview, offset: int, frame: Frame) -> bool:
    """True if the record CRC of `frame` (at `offset` of `buf`) matches the bytes that follow."""
    body_end = offset + FRAME_BYTES + frame.header_len + frame.payload_len
    head_crc = crc32c(buf[offset : offset + 12])
    return crc32c(buf[offset + FRAME_BYTES : body_end], value=head_crc) == frame.crc
