"""Schema evolution across a restart: a leader with the old columns leaves a WAL (a pending
block and buffered rows after it), the next leader with new columns recovers from it.

Compatible changes (a Nullable column added, a column dropped, columns reordered) replay every
offset exactly once, old rows converted; an incompatible one (a column retyped, a required
column added) fails the pipeline for good before anything is flushed or consumed, naming the
record, the column, both types and the migration steps.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hakafka.config import ColumnConfig, Config
from hakafka.coordination import PendingIntent
from hakafka.pipeline import PipelineLeader, PipelineState
from tests.pipeline.fakes import (
    TOPIC,
    Harness,
    Topic,
    one_partition,
    pipeline_config,
    wait_for,
)
from wal import WriteAheadLog

Start = Callable[[Harness], PipelineLeader]


@pytest.fixture
def start() -> Iterator[Start]:
    """Starts a leader over a harness; each one is stopped at the end, also on failure."""
    started: list[PipelineLeader] = []

    def run(h: Harness) -> PipelineLeader:
        leader = h.leader()
        started.append(leader)
        leader.start()
        return leader

    yield run
    for leader in started:
        leader.stop(0.0)


def with_columns(config: Config, **columns: str) -> Config:
    """`config` with its pipeline's declared columns replaced by `columns`, in that order."""
    pipeline = dataclasses.replace(
        config.pipelines[0], columns=tuple(ColumnConfig(n, t) for n, t in columns.items())
    )
    return dataclasses.replace(config, pipelines=(pipeline,))


def crash_with_a_block_in_flight(
    h: Harness, topic: Topic, start: Start, consumed_after: int
) -> PendingIntent:
    """A leader writes `pending` for its first block and consumes `consumed_after` more
    messages into its WAL; it dies before the insert lands. Returns the intent it left, with
    `h` switched to the next term."""
    h.sink.gate.clear()
    first = start(h)
    wait_for(h.sink.entered.is_set, "the first flush")
    topic.produce(0, consumed_after)
    wait_for(lambda: first.positions() == topic.end_offsets(), "the rows after the block")
    first.stop(0.0)  # the term is lost: the insert in flight is abandoned ...
    h.sink.fail(1)  # ... and never lands
    h.sink.gate.set()
    wait_for(lambda: not h.catalog.names(), "the old leader to let its WAL go")
    pending = h.fenced.pending
    assert pending is not None and h.fenced.commits == 0 and not h.sink.rows
    h.fenced = h.fenced.next_term()
    return pending


def test_a_nullable_column_added_after_a_crash_replays_the_wal_exactly_once(
    tmp_path: Path, start: Start
) -> None:
    topic, h = one_partition(tmp_path, 100)
    pending = crash_with_a_block_in_flight(h, topic, start, consumed_after=70)
    pending_end = pending.ranges[TOPIC][0][1]
    h.config = with_columns(h.config, user="String", amount="Int64", note="Nullable(String)")
    second = start(h)
    wait_for(lambda: h.fenced.checkpoint.get(TOPIC) == {0: 170}, "both blocks committed")
    assert h.sink.offsets() == [(0, o) for o in range(170)]  # each offset exactly once
    assert h.refetch is not None and h.refetch.calls == 0  # the pending block came from the WAL
    assert second.status.replayed_rows == 170 - pending_end
    assert h.consumers[-1].assigned_from == {0: 170}
    for table in h.sink.rows.values():  # the re-flushed block and the replayed rows
        assert table.schema.equals(second.buffer.rows.schema)
        assert table.column("note").null_count == table.num_rows
        assert table.column("amount").to_pylist() == table.column("_offset").to_pylist()
    assert second.status.state is PipelineState.CONSUMING


def stop_with_rows_only_in_the_wal(tmp_path: Path, start: Start, count: int) -> Harness:
    """A leader that never flushes consumes `count` messages and stops cleanly: no pending
    block, every row only in its WAL. Returns the harness, switched to the next term."""
    _topic, h = one_partition(tmp_path, count, min_rows=1_000_000, min_age=3600.0, max_age=3600.0)
    first = start(h)
    wait_for(lambda: first.buffer.rows.row_count == count, "the rows in the buffer")
    assert first.stop(1.0)
    assert h.fenced.pending is None and h.fenced.commits == 0
    h.fenced = h.fenced.next_term()
    return h


def test_dropped_and_reordered_columns_replay_buffered_rows(tmp_path: Path, start: Start) -> None:
    h = stop_with_rows_only_in_the_wal(tmp_path, start, 50)
    h.config = with_columns(pipeline_config(), note="Nullable(Float64)", amount="Int64")
    second = start(h)
    wait_for(lambda: h.fenced.checkpoint.get(TOPIC) == {0: 50}, "the replayed rows committed")
    assert second.status.replayed_rows == 50
    assert h.sink.offsets() == [(0, o) for o in range(50)]
    (table,) = h.sink.rows.values()
    assert table.schema.equals(second.buffer.rows.schema)
    assert table.column_names[:2] == ["note", "amount"] and "user" not in table.column_names
    assert table.column("amount").to_pylist() == list(range(50))
    assert table.column("note").null_count == 50


def test_old_rows_below_the_checkpoint_do_not_hold_back_a_retyped_column(
    tmp_path: Path, start: Start
) -> None:
    # The WAL keeps flushed records until their segment goes: only rows still needed count.
    _topic, h = one_partition(tmp_path, 40)
    first = start(h)
    wait_for(lambda: h.fenced.checkpoint.get(TOPIC) == {0: 40}, "every row committed")
    assert first.stop(1.0)
    with WriteAheadLog.open(tmp_path / h.wal_dir_name, fsync="off") as log:
        assert any(log.replay()), "the flushed records are still in the WAL"
    h.fenced = h.fenced.next_term()
    h.config = with_columns(pipeline_config(), user="String", amount="String")
    second = start(h)
    assert second.wait_consuming(5.0), second.status.error
    assert second.status.replayed_rows == 0
    assert h.consumers[-1].assigned_from == {0: 40}


@pytest.mark.parametrize("left", ["pending-block", "buffered-rows"])
@pytest.mark.parametrize(
    ("columns", "named"),
    [
        pytest.param(
            {"user": "String", "amount": "String"},
            "column 'amount' is int64 in the WAL and string now (String)",
            id="retyped",
        ),
        pytest.param(
            {"user": "String", "amount": "Int64", "score": "Int32"},
            "column 'score' is absent from the WAL and required now (Int32)",
            id="required-added",
        ),
    ],
)
def test_an_incompatible_change_fails_recovery_before_any_flush(
    tmp_path: Path, start: Start, left: str, columns: dict[str, str], named: str
) -> None:
    if left == "pending-block":
        topic, h = one_partition(tmp_path, 100)
        crash_with_a_block_in_flight(h, topic, start, consumed_after=70)
    else:
        h = stop_with_rows_only_in_the_wal(tmp_path, start, 100)
    attempts, consumers = h.sink.attempts, len(h.consumers)
    h.config = with_columns(pipeline_config(), **columns)
    second = start(h)
    wait_for(lambda: not second.running, "the pipeline to fail")
    status = second.status
    assert status.state is PipelineState.FAILED
    assert status.restartable is False
    error = status.error or ""
    assert "SchemaChangeError: pipeline 'events': WAL record at 0:" in error
    assert named in error
    assert "revert the column change" in error
    assert "hakafka wal inspect --pipeline events" in error
    # Nothing flushed, committed or consumed: the WAL is left as it was for the migration.
    assert h.sink.attempts == attempts and not h.sink.rows
    assert h.fenced.commits == 0
    assert len(h.consumers) == consumers
