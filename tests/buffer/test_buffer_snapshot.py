"""Snapshots under a concurrent appender and flusher: whole appends only, exact watermarks,
and combined with the flushed rows no gap and no duplicate."""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from buffer import MemoryTable, Snapshot

PARTITIONS = 3
APPENDS = 900
ROWS = 37  # not a divisor of anything: a torn batch would show


def offsets_by_partition(table: pa.Table) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for part, off in zip(
        table.column("_partition").to_pylist(), table.column("_offset").to_pylist(), strict=True
    ):
        out.setdefault(part, []).append(off)
    return out


def check_snapshot(snap: Snapshot) -> None:
    """Every partition's rows are exactly its range, whole batches, watermark = last row."""
    data = snap.to_table()
    assert data.num_rows == snap.rows
    got = offsets_by_partition(data)
    assert set(got) == {p for _, p in snap.ranges}
    for (_, part), rng in snap.ranges.items():
        assert got[part] == list(range(rng.first, rng.last + 1))
        assert (rng.last + 1) % ROWS == 0 and rng.first % ROWS == 0  # whole appends only
        assert snap.watermark[("t", part)] == max(got[part])


def test_snapshots_under_concurrent_append_seal_commit(
    schema: pa.Schema, batch_factory: Any
) -> None:
    table = MemoryTable("events", schema, limit_bytes=1 << 30)
    flushed: list[pa.Table] = []  # what a flush has put in the sink ("ClickHouse") before commit
    flushed_lock = threading.Lock()
    done = threading.Event()
    errors: list[BaseException] = []

    def appender() -> None:
        try:
            for i in range(APPENDS):
                part = i % PARTITIONS
                table.append(*batch_factory("t", part, (i // PARTITIONS) * ROWS, ROWS))
        except BaseException as exc:
            errors.append(exc)
        finally:
            done.set()

    def flusher() -> None:
        rng = random.Random(7)
        try:
            while not done.is_set() or table.stats().rows:
                block = table.seal()
                if block is None:
                    time.sleep(0.001)
                    continue
                if rng.random() < 0.3:
                    table.abort(block)
                    continue
                with flushed_lock:
                    flushed.append(block.to_table())
                table.commit(block)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=appender), threading.Thread(target=flusher)]
    for t in threads:
        t.start()
    checked = 0
    deadline = time.monotonic() + 60
    last_marks: dict[tuple[str, int], int] = {}
    while (not done.is_set() or checked < 50) and time.monotonic() < deadline:
        snap = table.snapshot()
        check_snapshot(snap)
        for tp, mark in snap.watermark.items():
            assert mark >= last_marks.get(tp, -1)
            last_marks[tp] = mark
        with flushed_lock:
            sink = pa.concat_tables([schema.empty_table(), *flushed])
        # the reader's recipe: sink rows below each buffered partition's first offset + snapshot
        for (_, part), rng in snap.ranges.items():
            mask = pc.and_(
                pc.equal(sink.column("_partition"), part),
                pc.less(sink.column("_offset"), rng.first),
            )
            combined = sorted(sink.filter(mask).column("_offset").to_pylist()) + list(
                range(rng.first, rng.last + 1)
            )
            assert combined == list(range(rng.last + 1)), f"gap or duplicate in partition {part}"
        checked += 1
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    assert checked >= 50
    final = pa.concat_tables([*flushed, table.snapshot().to_table()])
    got = offsets_by_partition(final)
    per_part = APPENDS // PARTITIONS * ROWS
    assert {p: sorted(o) for p, o in got.items()} == {
        p: list(range(per_part)) for p in range(PARTITIONS)
    }
