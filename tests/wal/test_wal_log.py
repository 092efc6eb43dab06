"""WriteAheadLog behaviour on healthy logs: round trips, rolling, replay, truncation, locking,
fsync policies and contracts of the API."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest

from wal import (
    MAX_HEADER_BYTES,
    FsyncPolicy,
    Position,
    RecordType,
    WalClosedError,
    WalLockedError,
    WriteAheadLog,
)
from wal.segment import segment_name

FillLog = Callable[..., list[tuple[Position, bytes, bytes]]]
ReplayAll = Callable[[Path], list[tuple[Position, bytes, bytes]]]


def test_round_trip_across_segment_rolls(
    tmp_path: Path, fill_log: FillLog, replay_all: ReplayAll
) -> None:
    sizes = [(seq * 7919) % 20_000 for seq in range(500)]
    written = fill_log(tmp_path, sizes, segment_bytes=64 << 10)
    got = replay_all(tmp_path)
    assert got == written
    segments = [p for p in sorted(os.listdir(tmp_path)) if p.endswith(".wal")]
    assert len(segments) > 50
    assert segments == [segment_name(i) for i in range(len(segments))]
    for name in segments[:-1]:
        assert os.path.getsize(tmp_path / name) <= 64 << 10
    positions = [pos for pos, _, _ in written]
    assert positions == sorted(positions)


def test_record_bigger_than_segment_gets_its_own(
    tmp_path: Path, fill_log: FillLog, replay_all: ReplayAll
) -> None:
    written = fill_log(tmp_path, [100, 10_000, 100, 100], segment_bytes=1024)
    assert [pos for pos, _, _ in written] == [
        Position(0, 0),
        Position(1, 0),
        Position(2, 0),
        Position(2, 16 + len(written[2][1]) + 100),
    ]
    assert replay_all(tmp_path) == written


def test_replay_from_a_position(tmp_path: Path, fill_log: FillLog) -> None:
    written = fill_log(tmp_path, [3000] * 40, segment_bytes=10_000)
    with WriteAheadLog.open(tmp_path) as log:
        for start in (0, 1, 2, 3, 17, 39):
            got = [(r.position, r.header, bytes(r.payload)) for r in log.replay(written[start][0])]
            assert got == written[start:]
        last = next(iter(log.replay(written[-1][0])))
        assert list(log.replay(last.end)) == []


def test_replay_rejects_a_position_inside_a_record(tmp_path: Path, fill_log: FillLog) -> None:
    written = fill_log(tmp_path, [3000] * 4)
    inside = Position(written[2][0].segment, written[2][0].offset + 5)
    with WriteAheadLog.open(tmp_path) as log, pytest.raises(ValueError, match="record boundary"):
        list(log.replay(inside))


def test_replay_yields_only_records_appended_before_the_call(tmp_path: Path) -> None:
    with WriteAheadLog.open(tmp_path) as log:
        log.append(b"a", b"1")
        records = log.replay()
        first = next(records)
        log.append(b"b", b"2")
        assert first.header == b"a"
        assert list(records) == []
        assert [r.header for r in log.replay()] == [b"a", b"b"]


def test_append_accepts_arrow_buffers_without_copy_and_replays_the_batch(tmp_path: Path) -> None:
    batch = pa.record_batch({"x": list(range(10_000)), "s": [str(i) for i in range(10_000)]})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    ipc = sink.getvalue()
    with WriteAheadLog.open(tmp_path) as log:
        log.append(b'{"pipeline": "p"}', ipc)
        (record,) = list(log.replay())
    assert record.type is RecordType.FULL
    assert record.payload.readonly
    assert pa.ipc.open_stream(record.payload).read_all().to_batches()[0].equals(batch)


def test_truncate_before_deletes_whole_older_segments_only(
    tmp_path: Path, fill_log: FillLog
) -> None:
    written = fill_log(tmp_path, [3000] * 30, segment_bytes=10_000)
    cut = written[13][0]
    with WriteAheadLog.open(tmp_path, segment_bytes=10_000) as log:
        before = [s.index for s in log.segments()]
        removed = log.truncate_before(cut)
        assert [p.name for p in removed] == [segment_name(i) for i in before if i < cut.segment]
        assert log.truncate_before(cut) == []
        assert [s.index for s in log.segments()] == [i for i in before if i >= cut.segment]
        got = [bytes(r.payload) for r in log.replay()]
        first_kept = next(i for i, (pos, _, _) in enumerate(written) if pos.segment == cut.segment)
        assert got == [payload for _, _, payload in written[first_kept:]]
        assert [r.header for r in log.replay(written[0][0])] == [
            h for _, h, _ in written[first_kept:]
        ]


def test_truncate_before_never_deletes_the_active_segment(
    tmp_path: Path, fill_log: FillLog
) -> None:
    fill_log(tmp_path, [3000] * 10, segment_bytes=10_000)
    with WriteAheadLog.open(tmp_path, segment_bytes=10_000) as log:
        active = log.segments()[-1]
        log.truncate_before(Position(active.index + 5, 0))
        assert [s.index for s in log.segments()] == [active.index]
        pos = log.append(b"h", b"after")
        assert pos == Position(active.index, active.size)
        assert [bytes(r.payload) for r in log.replay()][-1] == b"after"


def test_second_writer_fails_at_once_naming_directory_and_pid(tmp_path: Path) -> None:
    with WriteAheadLog.open(tmp_path):
        started = time.monotonic()
        with pytest.raises(WalLockedError) as info:
            WriteAheadLog.open(tmp_path)
        assert time.monotonic() - started < 1
        assert str(tmp_path) in str(info.value)
        assert f"pid {os.getpid()}" in str(info.value)
    with WriteAheadLog.open(tmp_path) as log:  # released on close
        log.append(b"", b"x")


@pytest.mark.parametrize(
    ("policy", "sync_calls", "expected_syncs"),
    [("always", 0, 20), ("batch", 3, 3), ("off", 3, 3), ("batch", 0, 0)],
)
def test_fsync_policy_decides_the_number_of_fdatasyncs(
    tmp_path: Path, policy: str, sync_calls: int, expected_syncs: int
) -> None:
    with WriteAheadLog.open(tmp_path, fsync=policy) as log:
        for i in range(20):
            log.append(b"", b"x" * 100)
            if sync_calls and i % 7 == 6:
                log.sync()
        log.sync()  # nothing new since the last sync for these counts: free
        stats = log.stats
    want = expected_syncs + (1 if sync_calls == 0 and policy == "batch" else 0)
    assert stats.appends == 20
    assert stats.bytes == 20 * 116
    assert stats.syncs == want


def test_interval_policy_syncs_in_the_background(tmp_path: Path) -> None:
    with WriteAheadLog.open(tmp_path, fsync=FsyncPolicy.INTERVAL, interval_ms=20) as log:
        log.append(b"", b"x")
        deadline = time.monotonic() + 10
        while log.stats.syncs == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert log.stats.syncs == 1
        time.sleep(0.1)
        assert log.stats.syncs == 1  # nothing new appended: no further fdatasync


def test_segment_roll_syncs_the_sealed_segment(tmp_path: Path) -> None:
    with WriteAheadLog.open(tmp_path, fsync="batch", segment_bytes=1000) as log:
        log.append(b"", b"x" * 900)
        log.append(b"", b"y" * 900)
        assert log.stats.syncs == 1
        assert len(log.segments()) == 2


def test_bad_arguments_name_what_is_wrong(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="fsync policy 'sometimes'"):
        WriteAheadLog.open(tmp_path, fsync="sometimes")
    with pytest.raises(ValueError, match="segment_bytes"):
        WriteAheadLog.open(tmp_path, segment_bytes=0)
    with WriteAheadLog.open(tmp_path) as log:
        with pytest.raises(ValueError, match=f"max {MAX_HEADER_BYTES}"):
            log.append(b"h" * (MAX_HEADER_BYTES + 1), b"")
        log.append(b"still", b"usable")
        assert [r.header for r in log.replay()] == [b"still"]


def test_closed_log_refuses_work_and_close_is_idempotent(tmp_path: Path) -> None:
    log = WriteAheadLog.open(tmp_path)
    log.append(b"", b"x")
    log.close()
    log.close()
    with pytest.raises(WalClosedError, match="closed"):
        log.append(b"", b"y")
    with pytest.raises(WalClosedError):
        list(log.replay())


def test_active_segment_reserves_its_size_and_gives_the_rest_back_when_sealed_or_closed(
    tmp_path: Path,
) -> None:
    segment_bytes = 1 << 20

    def disk_bytes(path: Path) -> int:
        return os.stat(path).st_blocks * 512

    with WriteAheadLog.open(tmp_path, segment_bytes=segment_bytes) as log:
        log.append(b"h", b"x" * 1000)
        first = log.segments()[0]
        assert first.size == 16 + 1 + 1000  # the reservation never shows in the size
        assert disk_bytes(first.path) >= segment_bytes
    assert disk_bytes(first.path) < 64 << 10
    with WriteAheadLog.open(tmp_path, segment_bytes=segment_bytes) as log:
        assert disk_bytes(first.path) >= segment_bytes  # reopened: active again
        log.append(b"h", b"y" * (segment_bytes - 1000))  # does not fit: rolls
        sealed, active = log.segments()
        assert sealed.size == first.size
        assert disk_bytes(sealed.path) < 64 << 10
        assert disk_bytes(active.path) >= segment_bytes
        assert [bytes(r.payload[:1]) for r in log.replay()] == [b"x", b"y"]
