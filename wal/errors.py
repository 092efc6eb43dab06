"""Exceptions raised by the WAL."""

from __future__ import annotations


class WalError(Exception):
    """Base class of every error the WAL raises on purpose."""


class WalLockedError(WalError):
    """Another writer holds the directory lock."""


class WalClosedError(WalError):
    """The log was closed, or failed earlier (e.g. a failed fsync) and must be reopened."""


class SegmentDamageError(WalError):
    """Bytes at a position of a segment file are not a valid record.

    `incomplete` is True when the file ends inside the record (a torn write), False when the
    bytes are there but wrong (CRC mismatch, impossible length).
    """

    def __init__(self, path: str, segment: int, offset: int, reason: str, incomplete: bool):
        super().__init__(f"{path}: damaged record at segment {segment} byte {offset}: {reason}")
        self.path = path
        self.segment = segment
        self.offset = offset
        self.reason = reason
        self.incomplete = incomplete
