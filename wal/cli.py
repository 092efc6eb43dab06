"""Command line: `python -m wal inspect DIR` and `python -m wal verify DIR` (read-only).

Both scan every record without taking the writer lock and without changing anything; on a log
that a writer is appending to, the last record may show as a torn tail. Exit code 0 when the log
is clean, 1 when damage was found, 2 for usage errors or a missing directory.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from wal.repair import LogScan, scan_log

_SUMMARY_CHARS = 60


def _summary(header: bytes | None) -> str:
    """A short printable form of a caller header."""
    if header is None:
        return "-"
    text = header.decode("utf-8", "backslashreplace")
    return text if len(text) <= _SUMMARY_CHARS else text[: _SUMMARY_CHARS - 3] + "..."


def _print_damage(scan: LogScan, out: TextIO) -> None:
    if scan.torn_tail is not None:
        torn = scan.torn_tail
        print(
            f"TORN TAIL: {torn.path} at byte {torn.offset}: {torn.bytes_truncated} bytes "
            f"({torn.reason}); opening the log truncates them",
            file=out,
        )
    if scan.corruption is not None:
        bad = scan.corruption
        print(
            f"CORRUPT: segment {bad.segment} ({bad.path}) at byte {bad.offset}: {bad.reason}; "
            f"{len(scan.unreachable)} later segment(s) unreachable",
            file=out,
        )


def inspect(directory: Path, out: TextIO) -> int:
    """Print every segment with record count, bytes and first/last header, then any damage."""
    scan = scan_log(directory)
    print(
        f"{'segment':<26} {'records':>8} {'bytes':>12} {'valid':>12}  first / last header", file=out
    )
    for seg in scan.segments:
        print(
            f"{seg.info.path.name:<26} {seg.records:>8} {seg.info.size:>12} {seg.valid_bytes:>12}"
            f"  {_summary(seg.first_header)} / {_summary(seg.last_header)}",
            file=out,
        )
    for info in scan.unreachable:
        print(f"{info.path.name:<26} {'?':>8} {info.size:>12} {'-':>12}  (after damage)", file=out)
    total = sum(seg.info.size for seg in scan.segments)
    print(
        f"total: {len(scan.segments)} segment(s), {scan.records} record(s), {total} bytes", file=out
    )
    _print_damage(scan, out)
    return _exit_code(scan)


def verify(directory: Path, out: TextIO) -> int:
    """Print one line saying whether the log is intact, then any damage."""
    scan = scan_log(directory)
    if scan.torn_tail is None and scan.corruption is None:
        print(
            f"OK: {directory}: {len(scan.segments)} segment(s), {scan.records} record(s)", file=out
        )
    _print_damage(scan, out)
    return _exit_code(scan)


def _exit_code(scan: LogScan) -> int:
    return 0 if scan.torn_tail is None and scan.corruption is None else 1


def main(argv: Sequence[str] | None = None, out: TextIO = sys.stdout) -> int:
    parser = argparse.ArgumentParser(prog="python -m wal", description="Check a WAL directory.")
    parser.add_argument("command", choices=["inspect", "verify"])
    parser.add_argument("directory", type=Path)
    args = parser.parse_args(argv)
    directory: Path = args.directory
    if not directory.is_dir():
        print(f"error: {directory} is not a directory", file=sys.stderr)
        return 2
    return inspect(directory, out) if args.command == "inspect" else verify(directory, out)
