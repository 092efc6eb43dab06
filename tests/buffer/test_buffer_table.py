"""MemoryTable: append, seal/commit/abort, deterministic block ids, overlaps, BufferFull."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pyarrow as pa
import pytest

from buffer import (
    BlockStateError,
    BufferFull,
    MemoryTable,
    OffsetOverlapError,
    OffsetRange,
)
from buffer.table import block_id_for


def test_seal_returns_none_when_empty(table: MemoryTable) -> None:
    assert table.seal() is None


def test_seal_block_holds_rows_bytes_and_merged_ranges(
    table: MemoryTable, batch_factory: Any
) -> None:
    b1, r1 = batch_factory("t", 0, 0, 100)
    b2, r2 = batch_factory("t", 1, 40, 50)
    b3, r3 = batch_factory("t", 0, 100, 100)
    for b, r in ((b1, r1), (b2, r2), (b3, r3)):
        table.append(b, r)
    block = table.seal()
    assert block is not None
    assert block.rows == 250
    assert block.nbytes == sum(b.get_total_buffer_size() for b in (b1, b2, b3))
    assert dict(block.ranges) == {("t", 0): OffsetRange(0, 199), ("t", 1): OffsetRange(40, 89)}
    assert block.batches == (b1, b2, b3)
    assert block.to_table().column("_offset").to_pylist() == [
        *range(100),
        *range(40, 90),
        *range(100, 200),
    ]
    assert table.stats().rows == 0 and table.stats().oldest_append is None
    assert table.seal() is None  # nothing new, and the block is in flight


def test_stats_cover_only_the_open_part(schema: pa.Schema, batch_factory: Any) -> None:
    now = [50.0]
    table = MemoryTable("events", schema, limit_bytes=1 << 30, clock=lambda: now[0])
    batch, ranges = batch_factory("t", 0, 0, 10)
    table.append(batch, ranges)
    now[0] = 60.0
    table.append(*batch_factory("t", 0, 10, 5))
    stats = table.stats()
    assert (stats.rows, stats.oldest_append) == (15, 50.0)
    assert table.seal() is not None
    now[0] = 70.0
    table.append(*batch_factory("t", 0, 15, 1))
    assert (table.stats().rows, table.stats().oldest_append) == (1, 70.0)


def test_block_id_is_deterministic_and_depends_only_on_ranges(
    schema: pa.Schema, batch_factory: Any
) -> None:
    ids = []
    for _ in range(2):
        table = MemoryTable("events", schema, limit_bytes=1 << 30)
        table.append(*batch_factory("t", 1, 40, 50))
        table.append(*batch_factory("t", 0, 0, 100))
        block = table.seal()
        assert block is not None
        ids.append(block.block_id)
    assert ids[0] == ids[1]
    assert len(ids[0]) == 16 and int(ids[0], 16) >= 0
    other = {("t", 0): OffsetRange(0, 99), ("t", 1): OffsetRange(40, 90)}
    assert block_id_for(other) != ids[0]
    code = (
        "from buffer.table import block_id_for, OffsetRange;"
        "print(block_id_for({('t', 0): OffsetRange(0, 99), ('t', 1): OffsetRange(40, 89)}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == ids[0]


def test_commit_drops_block_and_snapshot_keeps_sealed_until_then(
    table: MemoryTable, batch_factory: Any
) -> None:
    table.append(*batch_factory("t", 0, 0, 100))
    block = table.seal()
    assert block is not None
    table.append(*batch_factory("t", 0, 100, 10))
    snap = table.snapshot()
    assert snap.rows == 110  # sealed-but-uncommitted rows stay visible
    assert snap.watermark == {("t", 0): 109}
    table.commit(block)
    snap = table.snapshot()
    assert snap.rows == 10
    assert dict(snap.ranges) == {("t", 0): OffsetRange(100, 109)}
    assert table.nbytes == snap.nbytes


def test_commit_out_of_order_is_refused(table: MemoryTable, batch_factory: Any) -> None:
    table.append(*batch_factory("t", 0, 0, 10))
    first = table.seal()
    table.append(*batch_factory("t", 0, 10, 10))
    second = table.seal()
    assert first is not None and second is not None
    with pytest.raises(BlockStateError, match=f"commit of block {second.block_id} which is not"):
        table.commit(second)
    table.commit(first)
    table.commit(second)
    with pytest.raises(BlockStateError):
        table.commit(second)  # already committed
    assert table.snapshot().rows == 0 == table.row_count and table.nbytes == 0


def test_abort_returns_the_same_block_on_the_next_seal(
    table: MemoryTable, batch_factory: Any
) -> None:
    table.append(*batch_factory("t", 0, 0, 10))
    block = table.seal()
    assert block is not None
    table.append(*batch_factory("t", 0, 10, 5))  # arrives while the flush runs
    table.abort(block)
    assert table.snapshot().rows == 15 == table.row_count  # sealed blocks count until commit
    retry = table.seal()
    assert retry is block
    assert retry.block_id == block.block_id and retry.rows == 10
    table.commit(block)
    assert table.row_count == 5
    nxt = table.seal()
    assert nxt is not None and dict(nxt.ranges) == {("t", 0): OffsetRange(10, 14)}


def test_abort_of_a_block_not_in_flight_is_refused(table: MemoryTable, batch_factory: Any) -> None:
    table.append(*batch_factory("t", 0, 0, 10))
    block = table.seal()
    assert block is not None
    table.abort(block)
    with pytest.raises(BlockStateError, match=f"abort of block {block.block_id}"):
        table.abort(block)


@pytest.mark.parametrize(("first", "rows"), [(5, 10), (9, 1), (0, 3)])
def test_overlapping_or_backwards_range_is_refused(
    table: MemoryTable, batch_factory: Any, first: int, rows: int
) -> None:
    table.append(*batch_factory("orders", 3, 0, 10))
    with pytest.raises(OffsetOverlapError) as err:
        table.append(*batch_factory("orders", 3, first, rows))
    text = str(err.value)
    assert "topic 'orders' partition 3" in text
    assert f"range {first}..{first + rows - 1}" in text and "offset 9" in text
    assert table.snapshot().rows == 10 == table.row_count  # nothing of the refused batch was kept


def test_overlap_is_refused_after_commit_too(table: MemoryTable, batch_factory: Any) -> None:
    table.append(*batch_factory("t", 0, 0, 10))
    block = table.seal()
    assert block is not None
    table.commit(block)
    with pytest.raises(OffsetOverlapError):
        table.append(*batch_factory("t", 0, 9, 1))
    table.append(*batch_factory("t", 0, 12, 1))  # a gap (compaction) is fine


def test_schema_mismatch_and_empty_ranges_are_refused(
    table: MemoryTable, batch_factory: Any
) -> None:
    other = pa.record_batch({"x": [1]})
    with pytest.raises(ValueError, match=r"batch schema .* differs from table schema"):
        table.append(other, {("t", 0): OffsetRange(0, 0)})
    batch, _ = batch_factory("t", 0, 0, 1)
    with pytest.raises(ValueError, match="batch has no offset ranges"):
        table.append(batch, {})
    with pytest.raises(ValueError, match=r"invalid offset range 5\.\.4"):
        OffsetRange(5, 4)


def test_buffer_full_at_the_limit_until_a_commit(schema: pa.Schema, batch_factory: Any) -> None:
    parts = [batch_factory("t", 0, i * 99, 99) for i in range(4)]  # 99 rows: equal sizes
    size = parts[0][0].get_total_buffer_size()
    assert {b.get_total_buffer_size() for b, _ in parts} == {size}
    table = MemoryTable("events", schema, limit_bytes=3 * size)
    for batch, ranges in parts[:3]:
        table.append(batch, ranges)
    assert table.nbytes == 3 * size
    with pytest.raises(BufferFull, match=rf"{3 * size} bytes buffered \+ {size} > limit_bytes"):
        table.append(*parts[3])
    assert table.snapshot().rows == 3 * 99
    block = table.seal()
    assert block is not None
    with pytest.raises(BufferFull):  # sealed but uncommitted bytes still count
        table.append(*parts[3])
    table.commit(block)
    table.append(*parts[3])  # the refused batch, retried
    assert table.snapshot().watermark == {("t", 0): 4 * 99 - 1}


def test_empty_table_accepts_one_oversized_batch(schema: pa.Schema, batch_factory: Any) -> None:
    table = MemoryTable("events", schema, limit_bytes=10)
    table.append(*batch_factory("t", 0, 0, 100))
    with pytest.raises(BufferFull):
        table.append(*batch_factory("t", 0, 100, 1))
