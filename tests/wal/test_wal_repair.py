"""Crash safety on open: torn tails are truncated, corruption is quarantined, and replay never
returns a damaged record nor loses a valid one before the damage."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from wal import Position, RepairReport, WriteAheadLog
from wal.segment import segment_name

Flip = Callable[[Path, int, int], bytes]
FillLog = Callable[..., list[tuple[Position, bytes, bytes]]]
ReplayAll = Callable[[Path], list[tuple[Position, bytes, bytes]]]
Written = list[tuple[Position, bytes, bytes]]


def _reopen(directory: Path) -> tuple[RepairReport, Written]:
    with WriteAheadLog.open(directory) as log:
        records = [(r.position, r.header, bytes(r.payload)) for r in log.replay()]
        return log.repair_report, records


def test_torn_tail_at_every_byte_of_the_last_record(tmp_path: Path, fill_log: FillLog) -> None:
    source = tmp_path / "source"
    written = fill_log(source, [500, 800, 300])
    last = written[-1][0]
    path = source / segment_name(last.segment)
    full = path.read_bytes()
    for cut in range(last.offset, len(full) + 1):
        work = tmp_path / f"cut{cut}"
        shutil.copytree(source, work)
        with open(work / segment_name(last.segment), "r+b") as file:
            file.truncate(cut)
        report, records = _reopen(work)
        if cut in (last.offset, len(full)):
            assert report.clean
        else:
            assert report.torn_tail is not None, cut
            assert report.torn_tail.offset == last.offset
            assert report.torn_tail.bytes_truncated == cut - last.offset
            assert report.corruption is None
            assert report.quarantined == ()
        assert records == (written if cut == len(full) else written[:-1])
        assert os.path.getsize(work / segment_name(last.segment)) in (last.offset, len(full))
        shutil.rmtree(work)


def test_zero_filled_tail_counts_as_torn(
    tmp_path: Path, fill_log: FillLog, replay_all: ReplayAll
) -> None:
    written = fill_log(tmp_path, [500, 800])
    path = tmp_path / segment_name(0)
    size = path.stat().st_size
    with open(path, "ab") as file:
        file.write(b"\0" * 5000)
    report, records = _reopen(tmp_path)
    assert report.torn_tail is not None
    assert (report.torn_tail.offset, report.torn_tail.bytes_truncated) == (size, 5000)
    assert records == written
    assert path.stat().st_size == size


def test_repair_reopens_clean_and_appends_after_the_valid_prefix(
    tmp_path: Path, fill_log: FillLog, flip: Flip
) -> None:
    written = fill_log(tmp_path, [3000] * 12, segment_bytes=10_000)
    damaged = written[4][0]
    path = tmp_path / segment_name(damaged.segment)
    data = flip(path, damaged.offset + 40, 0x10)
    later = [segment_name(i) for i in range(damaged.segment + 1, written[-1][0].segment + 1)]

    with WriteAheadLog.open(tmp_path, segment_bytes=10_000) as log:
        report = log.repair_report
        assert report.corruption is not None
        assert (report.corruption.segment, report.corruption.offset) == (
            damaged.segment,
            damaged.offset,
        )
        assert "CRC" in report.corruption.reason
        assert report.records == 4
        assert report.quarantined == (
            f"{segment_name(damaged.segment)}.at-{damaged.offset}.corrupt",
            *(f"{name}.at-0.corrupt" for name in later),
        )
        quarantined = (tmp_path / report.quarantined[0]).read_bytes()
        assert quarantined == data[damaged.offset :]
        pos = log.append(b"new", b"after repair")
        assert pos.segment == damaged.segment
        assert pos.offset == damaged.offset

    report, records = _reopen(tmp_path)
    assert report.clean
    assert records[:4] == written[:4]
    assert records[4][1:] == (b"new", b"after repair")
    assert len(records) == 5


def test_missing_segment_stops_replay_and_quarantines_what_follows(
    tmp_path: Path, fill_log: FillLog
) -> None:
    written = fill_log(tmp_path, [3000] * 12, segment_bytes=10_000)
    (tmp_path / segment_name(1)).unlink()
    report, records = _reopen(tmp_path)
    assert report.corruption is not None
    assert (report.corruption.segment, report.corruption.offset) == (1, 0)
    assert "missing" in report.corruption.reason
    assert records == [w for w in written if w[0].segment == 0]
    assert f"{segment_name(2)}.at-0.corrupt" in report.quarantined


def test_short_non_last_segment_is_corruption_not_a_torn_tail(
    tmp_path: Path, fill_log: FillLog
) -> None:
    written = fill_log(tmp_path, [3000] * 12, segment_bytes=10_000)
    path = tmp_path / segment_name(0)
    with open(path, "r+b") as file:
        file.truncate(path.stat().st_size - 10)
    report, records = _reopen(tmp_path)
    assert report.torn_tail is None
    assert report.corruption is not None
    assert report.corruption.segment == 0
    assert records == [w for w in written if w[0].segment == 0][:-1]


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    sizes=st.lists(st.integers(0, 3000), min_size=1, max_size=25),
    where=st.floats(0, 1, exclude_max=True),
    bit=st.integers(0, 7),
)
def test_bit_flip_anywhere_keeps_exactly_the_records_before_it(
    tmp_path_factory: pytest.TempPathFactory,
    fill_log: FillLog,
    sizes: list[int],
    where: float,
    bit: int,
) -> None:
    directory = tmp_path_factory.mktemp("flip")
    written = fill_log(directory, sizes, segment_bytes=8_000)
    files = sorted(p for p in directory.iterdir() if p.suffix == ".wal")
    total = sum(p.stat().st_size for p in files)
    target = int(where * total)
    for path in files:
        size = path.stat().st_size
        if target < size:
            break
        target -= size
    data = bytearray(path.read_bytes())
    data[target] ^= 1 << bit
    path.write_bytes(bytes(data))
    segment = int(path.name.split(".")[0])
    flipped = Position(segment, target)
    hit = max(i for i, (pos, _, _) in enumerate(written) if pos <= flipped)
    hit_pos = written[hit][0]

    report, records = _reopen(directory)

    assert records == written[:hit]
    assert report.torn_tail is None
    assert report.corruption is not None
    assert Position(report.corruption.segment, report.corruption.offset) == hit_pos
    assert report.quarantined
    shutil.rmtree(directory)
