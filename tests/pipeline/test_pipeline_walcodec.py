"""A consumed batch survives the WAL byte for byte, with and without dead letters."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from buffer import OffsetRange
from hakafka.pipeline.walcodec import WalBatch, WalRecordError, decode, encode
from wal import WriteAheadLog


def batch(n: int, start: int = 0) -> pa.RecordBatch:
    return pa.record_batch(
        {
            "id": pa.array(range(start, start + n), pa.int64()),
            "_partition": pa.array([3] * n, pa.int32()),
            "_offset": pa.array(range(start, start + n), pa.int64()),
        }
    )


def test_round_trip_through_the_log(tmp_path: Path) -> None:
    dead = pa.record_batch({"_offset": pa.array([7], pa.int64()), "_error": ["bad json"]})
    written = [
        WalBatch("events", {("t", 3): OffsetRange(0, 9)}, batch(10)),
        WalBatch(
            "events",
            {("t", 3): OffsetRange(10, 20), ("t", 5): OffsetRange(4, 4)},
            batch(11, 10),
            dead,
        ),
    ]
    with WriteAheadLog.open(tmp_path, fsync="batch") as log:
        for item in written:
            log.append(*encode(item))
        log.sync()
    with WriteAheadLog.open(tmp_path, fsync="batch") as log:
        read = [decode(record) for record in log.replay()]
    assert [r.pipeline for r in read] == ["events", "events"]
    assert [dict(r.ranges) for r in read] == [dict(w.ranges) for w in written]
    assert read[0].rows.equals(written[0].rows)
    assert read[0].dead_letters is None
    assert read[1].rows.equals(written[1].rows)
    assert read[1].dead_letters is not None and read[1].dead_letters.equals(dead)


def test_foreign_record_is_named_by_position(tmp_path: Path) -> None:
    with WriteAheadLog.open(tmp_path, fsync="off") as log:
        position = log.append(b"not json", b"payload")
        record = next(iter(log.replay()))
    with pytest.raises(WalRecordError, match=f"WAL record at {position}: header is not JSON"):
        decode(record)
