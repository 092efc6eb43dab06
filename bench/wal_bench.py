"""WAL throughput next to raw file I/O measured in the same run, in the same directory.

Append: WriteAheadLog with fsync=batch, one sync() per record (the daemon syncs once per consumed
batch), against raw sequential os.write + os.fdatasync of the same record sizes.
Replay: WriteAheadLog.replay() (CRC-checked) against a raw sequential readinto of the same files.
Raw and WAL runs are paired and alternate (raw first in even rounds, WAL first in odd ones), so
the disk's swings hit both alike: the ratio is the median of the pairs' ratios, printed with its
range; throughputs are medians. Targets: append >= 80 %, replay >= 50 %.

Run: .venv/bin/python bench/wal_bench.py [--dir DIR]
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import tempfile
import time
from pathlib import Path

from pairing import Paired, paired

from wal import WriteAheadLog

MIB = 1 << 20
# (record size, records per run): 64-128 MiB per run, each run a fresh file or log.
CASES = [(64 << 10, 1024), (1 * MIB, 128), (8 * MIB, 16)]
# A shared virtual disk's fdatasync swings by 20-30% from run to run: pair many short runs.
APPEND_ROUNDS = 11
REPLAY_ROUNDS = 11


def raw_append(directory: Path, payload: bytes, count: int) -> float:
    """Seconds to write+fdatasync `count` records to one fresh file."""
    fd = os.open(directory / "raw.bin", os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND)
    try:
        started = time.perf_counter()
        for _ in range(count):
            os.write(fd, payload)
            os.fdatasync(fd)
        return time.perf_counter() - started
    finally:
        os.close(fd)


def wal_append(directory: Path, payload: bytes, count: int) -> float:
    """Seconds to append+sync `count` records to a fresh WAL (fsync=batch)."""
    shutil.rmtree(directory / "wal", ignore_errors=True)
    with WriteAheadLog.open(directory / "wal", fsync="batch") as log:
        header = b'{"pipeline": "bench", "ranges": {"t": {"0": [0, 999]}}}'
        started = time.perf_counter()
        for _ in range(count):
            log.append(header, payload)
            log.sync()
        return time.perf_counter() - started


def raw_read(directory: Path, chunk: int) -> float:
    """Seconds to read every WAL segment file sequentially into a reused buffer."""
    buf = bytearray(chunk)
    started = time.perf_counter()
    for path in sorted((directory / "wal").glob("*.wal")):
        with open(path, "rb", buffering=0) as file:
            while file.readinto(buf):
                pass
    return time.perf_counter() - started


def wal_replay(directory: Path) -> float:
    """Seconds to replay every record of the WAL (opening it is not timed)."""
    with WriteAheadLog.open(directory / "wal") as log:
        started = time.perf_counter()
        for record in log.replay():
            assert record.payload.nbytes
        return time.perf_counter() - started


def row(test: str, label: str, mib: float, runs: Paired) -> str:
    """One line of the table: median throughputs, median ratio and its range."""
    return (
        f"{test:<8} {label:>7} {mib:>5.0f} {mib / runs.base_s():>10.1f} "
        f"{mib / runs.subject_s():>10.1f} {runs.ratio():>6.0%} {runs.span():>9}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=None, help="where to write (default: tmp)")
    args = parser.parse_args()
    directory = Path(tempfile.mkdtemp(prefix="wal_bench_", dir=args.dir))
    print(
        f"directory: {directory}  "
        f"(medians of {APPEND_ROUNDS} paired appends, {REPLAY_ROUNDS} reads)"
    )
    print(
        f"{'test':<8} {'record':>7} {'MiB':>5} {'raw MiB/s':>10} {'wal MiB/s':>10} "
        f"{'ratio':>6} {'range':>9}"
    )
    try:
        for size, count in CASES:
            payload = os.urandom(size)
            total = size * count / MIB
            label = f"{size // 1024} KiB" if size < MIB else f"{size // MIB} MiB"
            appends = paired(
                functools.partial(raw_append, directory, payload, count),
                functools.partial(wal_append, directory, payload, count),
                APPEND_ROUNDS,
            )
            (directory / "raw.bin").unlink()
            print(row("append", label, total, appends))
            replays = paired(
                functools.partial(raw_read, directory, size),
                functools.partial(wal_replay, directory),
                REPLAY_ROUNDS,
            )
            print(row("replay", label, total, replays))
    finally:
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
