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

from crc32c import crc32c

FRAME_BYTES = 16
MAX_HEADER_BYTES = 0xFFFF
MAX_PAYLOAD_BYTES = 1 << 30

_FIELDS = struct.Struct("<BBHI")
_CRC = struct.Struct("<I")


class RecordType(enum.IntEnum):
    """Kind of a record. FULL is a complete data record (the only kind written today)."""

    FULL = 1


@dataclass(frozen=True, order=True)
class Position:
    """Where a record starts: segment index, then byte offset inside that segment."""

    segment: int
    offset: int

    def __str__(self) -> str:
        return f"{self.segment}:{self.offset}"


@dataclass(frozen=True)
class Record:
    """One replayed record.

    `header` is a bytes copy. `payload` is a read-only memoryview over an immutable bytes object
    owned by this record alone: it stays valid as long as it is referenced (nothing reuses it).
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


@dataclass(frozen=True)
class Frame:
    """The decoded fixed-size frame of one record."""

    type: RecordType
    header_len: int
    payload_len: int
    crc: int

    @property
    def body_len(self) -> int:
        return self.header_len + self.payload_len


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


def decode_frame(frame: bytes) -> Frame:
    """Decode a 16-byte frame; raises FrameError naming what is wrong."""
    fields = frame[:8]
    (frame_crc,) = _CRC.unpack_from(frame, 8)
    if crc32c(fields) != frame_crc:
        raise FrameError("frame CRC mismatch (damaged type or length fields)")
    type_code, flags, header_len, payload_len = _FIELDS.unpack(fields)
    if type_code not in RecordType._value2member_map_ or flags != 0:
        raise FrameError(f"unknown record type {type_code} / flags {flags}")
    if payload_len > MAX_PAYLOAD_BYTES:
        raise FrameError(f"impossible payload length {payload_len} (max {MAX_PAYLOAD_BYTES})")
    (crc,) = _CRC.unpack_from(frame, 12)
    return Frame(RecordType(type_code), header_len, payload_len, crc)


def body_crc_matches(frame: bytes, frame_fields: Frame, body: memoryview) -> bool:
    """True if the record CRC in `frame` covers the first 12 frame bytes plus `body` exactly."""
    return crc32c(body, value=crc32c(frame[:12])) == frame_fields.crc
