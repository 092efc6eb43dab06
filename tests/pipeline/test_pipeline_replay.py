"""Replay, coverage and truncation decisions over WAL offset ranges."""

from __future__ import annotations

import pyarrow as pa

from buffer import OffsetRange as R
from hakafka.pipeline.replay import ReplayCursor, WalIndex, checkpoint_offsets, covers, select_rows
from wal import Position


def test_replay_starts_at_checkpoint_and_skips_flushed_records() -> None:
    cursor = ReplayCursor({0: 100, 1: 50})
    assert cursor.accept({0: R(0, 49), 1: R(0, 9)}) == {}
    assert cursor.accept({0: R(50, 149), 1: R(10, 59)}) == {0: R(100, 149), 1: R(50, 59)}
    assert cursor.accept({0: R(150, 199)}) == {0: R(150, 199)}
    assert cursor.next_offsets == {0: 200, 1: 60}


def test_a_gap_ends_replay_of_that_partition_only() -> None:
    cursor = ReplayCursor({0: 0, 1: 0})
    assert cursor.accept({0: R(0, 9), 1: R(0, 9)}) == {0: R(0, 9), 1: R(0, 9)}
    # Offsets 10..19 of partition 1 are missing from the WAL: Kafka must supply them.
    assert cursor.accept({0: R(10, 19), 1: R(20, 29)}) == {0: R(10, 19)}
    assert cursor.accept({0: R(20, 29), 1: R(30, 39)}) == {0: R(20, 29)}
    assert cursor.next_offsets == {0: 30, 1: 10}
    assert cursor.closed == {1}


def test_partition_without_checkpoint_starts_at_first_wal_offset() -> None:
    cursor = ReplayCursor({})
    assert cursor.accept({3: R(7, 9)}) == {3: R(7, 9)}
    assert cursor.next_offsets == {3: 10}


def test_coverage_needs_every_offset() -> None:
    records = [{0: R(0, 9)}, {0: R(10, 19), 1: R(0, 4)}, {1: R(6, 9)}]
    assert covers(records, {0: R(5, 19)})
    assert covers(records, {0: R(0, 0), 1: R(0, 4)})
    assert not covers(records, {1: R(0, 9)}), "offset 5 of partition 1 is missing"
    assert not covers(records, {0: R(0, 20)})
    assert not covers(records, {2: R(0, 0)})


def test_select_rows_keeps_order_and_ranges() -> None:
    batch = pa.record_batch(
        {
            "_partition": pa.array([0, 1, 0, 1, 0], pa.int32()),
            "_offset": pa.array([10, 5, 11, 6, 12], pa.int64()),
            "v": ["a", "b", "c", "d", "e"],
        }
    )
    picked = select_rows(batch, {0: R(11, 12), 1: R(5, 5)})
    assert picked.column("v").to_pylist() == ["b", "c", "e"]
    assert select_rows(batch, {}).num_rows == 0


def test_truncation_point_is_first_needed_record() -> None:
    index = WalIndex()
    index.add(Position(0, 0), {0: R(0, 9)})
    index.add(Position(0, 100), {0: R(10, 19), 1: R(0, 3)})
    index.add(Position(1, 0), {0: R(20, 29)})
    assert index.truncation_point({0: 10, 1: 0}) == Position(0, 100)
    assert index.truncation_point({0: 20, 1: 4}) == Position(1, 0)
    # Everything committed: keep only the last record's segment.
    assert index.truncation_point({0: 30, 1: 4}) == Position(1, 0)
    assert WalIndex().truncation_point({0: 1}) is None


def test_checkpoint_helpers() -> None:
    assert checkpoint_offsets({"t": {"0": 5, "3": 9}}, "t") == {0: 5, 3: 9}
    assert checkpoint_offsets({}, "t") == {}
