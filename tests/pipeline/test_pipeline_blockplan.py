"""A block's identity is its content: a re-flush follows the tasks the intent recorded.

Nodes with different `rows_per_task`, an attempt killed between tasks, a re-fetch that finds
other messages, settings changed under a pending block: every offset lands once, or the
pipeline stops naming the block. In-memory parts (tests/pipeline/fakes.py).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pyarrow as pa
import pytest

from buffer import OffsetRange
from hakafka.config import Config
from hakafka.coordination import PendingIntent
from hakafka.pipeline import PipelineLeader, PipelineState
from hakafka.pipeline.blockplan import BlockMismatchError, PlannedBlock, follow_plan, plan_block
from hakafka.pipeline.buffer import PipelineBlock, make_block
from tests.pipeline.fakes import (
    TOPIC,
    Harness,
    Topic,
    one_partition,
    pipeline_config,
    start,
    wait_for,
)


def with_rows_per_task(config: Config, rows_per_task: int) -> Config:
    return dataclasses.replace(
        config, spark=dataclasses.replace(config.spark, rows_per_task=rows_per_task)
    )


def killed_between_tasks(h: Harness, leaders: list[PipelineLeader], tasks: int) -> PendingIntent:
    """A leader's first flush inserts `tasks` tasks, then the node dies (its term ends);
    returns the intent it left, with `h` switched to the next term."""
    h.sink.gate.clear()
    h.sink.die_after_tasks = tasks
    first = start(h, leaders)
    wait_for(h.sink.entered.is_set, "the first flush")
    h.fenced.fenced = True
    h.sink.gate.set()
    wait_for(lambda: len(h.sink.rows) == tasks, f"{tasks} tasks inserted")
    first.stop(5.0)
    assert h.fenced.commits == 0 and h.fenced.pending is not None
    pending = h.fenced.pending
    h.fenced = h.fenced.next_term()
    return pending


def two_partitions() -> Topic:
    """120 messages over two partitions, three of them malformed (dead letters)."""
    topic = Topic(partitions=2)
    topic.produce(0, 70, bad=[5, 40])
    topic.produce(1, 50, bad=[0])
    return topic


@pytest.mark.parametrize("next_rows_per_task", [25, 100])
@pytest.mark.parametrize("other_node", [False, True])
def test_a_node_with_other_rows_per_task_completes_a_block_killed_between_tasks(
    tmp_path: Path, leaders: list[PipelineLeader], next_rows_per_task: int, other_node: bool
) -> None:
    topic = two_partitions()
    h = Harness(tmp_path, with_rows_per_task(pipeline_config(), 40), topic)
    pending = killed_between_tasks(h, leaders, tasks=1)
    assert len(pending.tasks) == 3  # 117 rows at 40 per task
    assert [t.rows for t in pending.tasks] == [39, 39, 39]
    assert sum(t.dead for t in pending.tasks) == 3
    # The next leader has another rows_per_task (its own config, or an edited one), and
    # rebuilds the block from its WAL or, on another node, from Kafka.
    h.config = with_rows_per_task(h.config, next_rows_per_task)
    if other_node:
        h.wal_dir_name = "another-node-wal"
    start(h, leaders)
    ends = {0: 70, 1: 50}
    wait_for(lambda: h.fenced.checkpoint.get(TOPIC) == ends, "the re-flush's checkpoint")
    good = [(0, o) for o in range(70) if o not in (5, 40)] + [(1, o) for o in range(1, 50)]
    assert h.sink.offsets() == sorted(good), "every row exactly once"
    assert h.sink.dead_offsets() == [(0, 5), (0, 40), (1, 0)]
    assert set(h.sink.rows) == {t.key for t in pending.tasks}, "the recorded tasks only"
    assert h.refetch is not None and h.refetch.calls == int(other_node)


def test_a_refetch_that_finds_fewer_messages_stops_naming_the_block(
    tmp_path: Path, leaders: list[PipelineLeader]
) -> None:
    topic, h = one_partition(tmp_path, 60)
    h.config = with_rows_per_task(h.config, 20)
    pending = killed_between_tasks(h, leaders, tasks=1)
    # Compaction removed offsets 30..34 before the next leader, on another node, re-reads.
    topic.logs[0] = [m for m in topic.logs[0] if not 30 <= (m.offset() or 0) < 35]
    h.wal_dir_name = "another-node-wal"
    attempts = h.sink.attempts
    second = start(h, leaders)
    wait_for(lambda: second.status.state is PipelineState.FAILED, "the pipeline to stop")
    error = second.status.error or ""
    assert f"block {pending.block_id}, task 2 of 3 (partition 0 offsets 20..39)" in error
    assert "recorded 20 rows and 0 dead letters, rebuilt 15 rows" in error
    assert not second.status.restartable, "every leader would find the same: ops decide"
    assert h.sink.attempts == attempts, "nothing written"
    assert h.fenced.checkpoint == {} and h.fenced.pending == pending


def test_a_setting_changed_under_a_pending_block_is_named_and_nothing_written(
    tmp_path: Path, leaders: list[PipelineLeader]
) -> None:
    _topic, h = one_partition(tmp_path, 30, bad=[7])
    pending = killed_between_tasks(h, leaders, tasks=1)
    h.config = pipeline_config(on_error="skip")
    attempts = h.sink.attempts
    second = start(h, leaders)
    wait_for(lambda: second.status.state is PipelineState.FAILED, "the pipeline to stop")
    assert (
        f"block {pending.block_id} was planned under other pipeline settings "
        "(on_error: recorded 'dead_letter', now 'skip')"
    ) in (second.status.error or "")
    assert h.sink.attempts == attempts and h.fenced.pending == pending


def test_an_intent_without_a_plan_is_flushed_the_way_its_writer_did(
    tmp_path: Path, leaders: list[PipelineLeader]
) -> None:
    # A pending block left by a version before plans: tokens <pipeline>:<block>:<i>.
    _topic, h = one_partition(tmp_path, 30)
    pending = killed_between_tasks(h, leaders, tasks=1)
    h.fenced.pending = PendingIntent(pending.block_id, pending.ranges, pending.epoch)
    h.sink.rows.clear()
    start(h, leaders)
    wait_for(lambda: h.fenced.checkpoint.get(TOPIC) == {0: 30}, "the re-flush's checkpoint")
    assert list(h.sink.rows) == [f"{pending.block_id}:0"]
    assert h.sink.offsets() == [(0, o) for o in range(30)]


def test_a_column_made_nullable_keeps_the_plan_and_a_retyped_one_does_not(tmp_path: Path) -> None:
    def block() -> PipelineBlock:
        rows = pa.table({"a": [1, 2, 3], "_partition": [0, 0, 0], "_offset": [0, 1, 2]})
        return make_block("b", {("t", 0): OffsetRange(0, 2)}, rows, None)

    planned = plan_block(block(), rows_per_task=2)
    settings = (("columns", "a Int64"), ("format", "json"))
    intent = PendingIntent("b", {"t": {0: (0, 3)}}, 1, planned.tasks, settings)
    nullable = (("columns", "a Nullable(Int64), b Nullable(String)"), ("format", "json"))
    assert [t.key for t in follow_plan(block(), intent, nullable, 100).rows] == [
        t.key for t in planned.rows
    ]
    with pytest.raises(BlockMismatchError, match=r"columns \['a Int64'\] were removed or retyped"):
        follow_plan(block(), intent, (("columns", "a String"), ("format", "json")), 100)


# Every kind of type the project supports, made Nullable the way ClickHouse allows it.
WIDENED = [
    ("Int64", "Nullable(Int64)"),
    ("Decimal(18, 4)", "Nullable(Decimal(18, 4))"),
    ("Enum8('a' = 1, 'b' = 2)", "Nullable(Enum8('a' = 1, 'b' = 2))"),
    ("Enum8('x, y' = 1, 'at a' = 2)", "Nullable(Enum8('x, y' = 1, 'at a' = 2))"),
    ("DateTime64(3, 'UTC')", "Nullable(DateTime64(3, 'UTC'))"),
    ("FixedString(4)", "Nullable(FixedString(4))"),
    ("LowCardinality(String)", "LowCardinality(Nullable(String))"),
    ("UUID", "Nullable(UUID)"),
]
# Retypings that read the block's values differently: each must stop the re-flush.
RETYPED = [
    ("Map(String, UInt8)", "Map(String, String)"),
    ("Decimal(18, 4)", "Nullable(Decimal(18, 5))"),
    ("Tuple(a Int64, b String)", "Tuple(a String, b Int64)"),
    ("Array(Int32)", "Array(Nullable(Int32))"),
    ("DateTime64(3, 'UTC')", "DateTime64(3, 'Europe/Berlin')"),
    ("Enum8('a' = 1, 'b' = 2)", "Enum8('a' = 1, 'b' = 3)"),
    ("Int64", "Nullable(String)"),
]


def _block() -> PipelineBlock:
    rows = pa.table({"a": [1, 2, 3], "_partition": [0, 0, 0], "_offset": [0, 1, 2]})
    return make_block("b", {("t", 0): OffsetRange(0, 2)}, rows, None)


def _intent_for(columns: str) -> tuple[PendingIntent, PlannedBlock]:
    """The intent of a block planned under `columns`, and its plan."""
    planned = plan_block(_block(), rows_per_task=2)
    settings = (("columns", columns), ("format", "json"))
    return PendingIntent("b", {"t": {0: (0, 3)}}, 1, planned.tasks, settings), planned


@pytest.mark.parametrize(("before", "after"), WIDENED)
def test_every_supported_type_made_nullable_keeps_the_plan(before: str, after: str) -> None:
    # Two such columns side by side, one with a path: the list is split where ClickHouse
    # types end, not at every ", " inside them.
    intent, planned = _intent_for(f"a {before}, m Map(String, UInt8), p {before} at x.y")
    now = (("columns", f"a {after}, m Map(String, UInt8), p {after} at x.y"), ("format", "json"))
    assert [t.key for t in follow_plan(_block(), intent, now, 100).rows] == [
        t.key for t in planned.rows
    ]


@pytest.mark.parametrize(("before", "after"), RETYPED)
def test_a_retyped_compound_column_stops_the_re_flush(before: str, after: str) -> None:
    intent, _ = _intent_for(f"a {before}, z String")
    now = (("columns", f"a {after}, z String"), ("format", "json"))
    with pytest.raises(BlockMismatchError, match=r"were removed or retyped") as raised:
        follow_plan(_block(), intent, now, 100)
    assert f"a {before}" in str(raised.value) and "'z String'" not in str(raised.value)


def test_swapped_map_value_types_stop_the_re_flush() -> None:
    intent, _ = _intent_for("m Map(String, UInt8), n Map(String, String)")
    now = (("columns", "m Map(String, String), n Map(String, UInt8)"), ("format", "json"))
    with pytest.raises(BlockMismatchError, match=r"\['m Map\(String, UInt8\)', 'n Map"):
        follow_plan(_block(), intent, now, 100)


def test_a_column_moved_to_another_path_stops_the_re_flush() -> None:
    intent, _ = _intent_for("a Int64 at x.y")
    with pytest.raises(BlockMismatchError, match=r"\['a Int64 at x.y'\]"):
        follow_plan(_block(), intent, (("columns", "a Int64 at x.z"), ("format", "json")), 100)
