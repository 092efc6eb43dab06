"""`spark_bridge.plan`: tasks named by the offsets they hold, and a re-flush cut along them."""

from __future__ import annotations

import itertools

import pyarrow as pa
import pytest

from spark_bridge.plan import (
    PlanError,
    Span,
    cut,
    offsets_digest,
    plan_tasks,
    sorted_rows,
    task_slices,
)


def rows(pairs: list[tuple[int, int]]) -> pa.Table:
    """A sorted table of (`_partition`, `_offset`) rows."""
    return pa.table(
        {
            "_partition": pa.array([p for p, _ in pairs], pa.int32()),
            "_offset": pa.array([o for _, o in pairs], pa.int64()),
        }
    )


def test_tasks_split_the_block_offsets_so_every_offset_is_in_exactly_one() -> None:
    # Partition 0 holds offsets 0..9 with rows at 1..8 (0 and 9: dead letters or markers),
    # partition 1 holds 20..24, all rows.
    table = rows([(0, o) for o in range(1, 9)] + [(1, o) for o in range(20, 25)])
    tasks = plan_tasks(table, {0: (0, 10), 1: (20, 25)}, rows_per_task=5)
    assert [t.spans for t in tasks] == [
        (Span(0, 0, 6),),  # rows 1..5 and the dead offset 0 before them
        (Span(0, 6, 10), Span(1, 20, 22)),
        (Span(1, 22, 25),),
    ]
    assert cut(table, tasks, "b") == [(0, 5), (5, 5), (10, 3)]
    spans = [s for t in tasks for s in t.spans]
    covered = sorted((s.partition, o) for s in spans for o in range(s.first, s.end))
    assert covered == [(0, o) for o in range(10)] + [(1, o) for o in range(20, 25)]


def test_a_cut_at_a_partition_start_begins_the_next_task_there() -> None:
    table = rows([(0, 0), (0, 1), (1, 5), (1, 6)])
    tasks = plan_tasks(table, {0: (0, 2), 1: (5, 7)}, rows_per_task=2)
    assert [t.spans for t in tasks] == [(Span(0, 0, 2),), (Span(1, 5, 7),)]


def test_keys_name_the_offsets_not_the_slicing() -> None:
    table = rows([(0, o) for o in range(12)])
    by_four = plan_tasks(table, {0: (0, 12)}, 4)
    by_six = plan_tasks(table, {0: (0, 12)}, 6)
    assert len({t.key for t in by_four}) == 3
    assert {t.key for t in by_four}.isdisjoint({t.key for t in by_six})
    assert [t.key for t in plan_tasks(table, {0: (0, 12)}, 4)] == [t.key for t in by_four]


def test_rows_outside_the_recorded_tasks_are_refused_with_their_offsets() -> None:
    table = rows([(0, o) for o in range(6)])
    tasks = plan_tasks(table, {0: (0, 6)}, 3)
    more = rows([(0, o) for o in range(7)])
    with pytest.raises(PlanError, match=r"block b: rows at \(partition, offset\) \[\(0, 6\)\]"):
        cut(more, tasks, "block b")
    other_partition = rows([(0, o) for o in range(6)] + [(3, 0)])
    with pytest.raises(PlanError, match=r"\[\(3, 0\)\] lie outside"):
        cut(other_partition, tasks, "block b")
    with pytest.raises(PlanError, match="outside the block's offsets"):
        plan_tasks(more, {0: (0, 6)}, 3)
    # Fewer rows still cut (the counts and digests are the caller's check).
    fewer = rows([(0, o) for o in range(6) if o != 2])
    assert cut(fewer, tasks, "b") == [(0, 2), (2, 3)]
    assert offsets_digest(fewer.slice(0, 2)) != offsets_digest(table.slice(0, 3))


def test_a_block_without_rows_is_one_task_over_its_offsets() -> None:
    tasks = plan_tasks(rows([]), {0: (3, 5), 2: (0, 1)}, 10)
    assert [t.spans for t in tasks] == [(Span(0, 3, 5), Span(2, 0, 1))]
    assert cut(rows([]), tasks, "b") == [(0, 0)]


def test_the_same_offsets_of_another_topic_get_other_keys() -> None:
    table = rows([(0, o) for o in range(4)])
    orders = plan_tasks(table, {0: (0, 4)}, 2, scope="orders")
    refunds = plan_tasks(table, {0: (0, 4)}, 2, scope="refunds")
    assert [t.spans for t in orders] == [t.spans for t in refunds]
    assert {t.key for t in orders}.isdisjoint({t.key for t in refunds})


def test_dictionary_columns_are_decoded_and_the_rows_sorted() -> None:
    table = pa.table(
        {
            "kind": pa.chunked_array([pa.array(["b", "a"]).dictionary_encode()]),
            "_partition": pa.array([1, 0], pa.int32()),
            "_offset": pa.array([7, 3], pa.int64()),
        }
    )

    rows = sorted_rows(table, "block 1")

    assert rows.schema.field("kind").type == pa.string()
    assert rows.to_pydict() == {"kind": ["a", "b"], "_partition": [0, 1], "_offset": [3, 7]}


def test_runs_of_consumed_batches_are_reordered_without_copying_a_row() -> None:
    # Two consumed batches, each with a run of partition 1 then one of partition 0.
    run = 1000
    pairs = [
        *((1, o) for o in range(run)),
        *((0, o) for o in range(run)),
        *((1, o) for o in range(run, 2 * run)),
        *((0, o) for o in range(run, 2 * run)),
    ]
    table = rows(pairs)
    table = table.append_column("value", pa.array([f"v{p}-{o}" for p, o in pairs]))

    out = sorted_rows(table, "block 1")

    assert (
        out.to_pydict()
        == table.sort_by([("_partition", "ascending"), ("_offset", "ascending")]).to_pydict()
    )
    # Each run is a slice of the original column: its data buffer is the original's.
    original = table.column("value").chunk(0).buffers()[2].address
    assert {chunk.buffers()[2].address for chunk in out.column("value").chunks} == {original}


def test_overlapping_or_short_runs_are_sorted_row_by_row() -> None:
    # Partition 0: a run 1..1000 then a run 500..1499 (a re-delivered stretch): overlapping.
    overlapping = rows([(0, o) for o in range(1, 1001)] + [(0, o) for o in range(500, 1500)])
    out = sorted_rows(overlapping, "block 1")
    offsets = out.column("_offset").to_pylist()
    assert offsets == sorted(offsets) and len(offsets) == 2000
    # One row per partition in turn: runs of one row.
    short = rows([(o % 3, o // 3) for o in range(30)])
    assert (
        sorted_rows(short, "block 2").to_pydict()
        == rows(sorted((o % 3, o // 3) for o in range(30))).to_pydict()
    )


def test_task_slices_are_a_pure_contiguous_cover() -> None:
    assert task_slices(0, 10) == []
    assert task_slices(10, 10) == [(0, 10)]
    assert task_slices(11, 10) == [(0, 6), (6, 5)]
    slices = task_slices(1_000_001, 250_000)
    assert len(slices) == 5
    assert slices[0][0] == 0 and sum(n for _, n in slices) == 1_000_001
    assert all(a + n == b for (a, n), (b, _) in itertools.pairwise(slices))
    assert task_slices(1_000_001, 250_000) == slices, "same input, same tasks (same tokens)"


def test_sorted_rows_orders_by_partition_then_offset_in_both_paths() -> None:
    # Consumed order (offsets rising per partition) and a shuffled order (they do not).
    consumed = pa.table(
        {"_partition": [1, 0, 1, 0, 2], "_offset": [5, 7, 6, 8, 1], "v": list("abcde")}
    )
    shuffled = consumed.take([3, 2, 4, 1, 0])
    for table in (consumed, shuffled):
        result = sorted_rows(table, "block b")
        assert list(
            zip(result["_partition"].to_pylist(), result["_offset"].to_pylist(), strict=True)
        ) == [
            (0, 7),
            (0, 8),
            (1, 5),
            (1, 6),
            (2, 1),
        ]
        assert result["v"].to_pylist() == ["b", "d", "a", "c", "e"]
