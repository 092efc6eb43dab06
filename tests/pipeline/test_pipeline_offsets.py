"""Offsets with in-memory parts: WAL ranges in consumer positions (contiguous across offsets
that hold no message), replay and re-flush across such gaps, and a checkpoint that never
moves backwards."""

from __future__ import annotations

from pathlib import Path

import pytest
import structlog.testing

from buffer import OffsetRange
from hakafka.pipeline import PipelineLeader, PipelineState
from hakafka.pipeline.replay import record_ranges
from tests.pipeline.fakes import (
    TOPIC,
    FakeConsumer,
    Harness,
    Topic,
    insert_then_lose_the_term,
    one_partition,
    pipeline_config,
    start,
    wait_for,
)
from wal import WriteAheadLog


def every_message(topic: Topic) -> list[tuple[int, int]]:
    return sorted((p, o) for p in topic.logs for o in topic.offsets(p))


def wal_ranges(h: Harness) -> list[dict[int, OffsetRange]]:
    """The per-partition range of every record in `h`'s WAL, in order."""
    wal = WriteAheadLog.open(h.tmp_path / h.wal_dir_name, fsync="off")
    try:
        return [record_ranges(record, TOPIC) for record in wal.replay()]
    finally:
        wal.close()


def consume_in_steps(h: Harness, leader: PipelineLeader, steps: list[dict[int, int]]) -> None:
    """Per step: produce `count` messages to a partition followed by one offset without a
    message (a negative count: only -count such offsets), then let the leader read it all
    in one poll (the consumer is held meanwhile) and wait until it has."""
    consumer = h.consumers[-1]
    for step in steps:
        consumer.paused = True
        for partition, count in step.items():
            if count > 0:
                h.topic.produce(partition, count)
            h.topic.gap(partition, 1 if count > 0 else -count)
        consumer.paused = False
        ends = h.topic.end_offsets()
        wait_for(lambda: leader.positions() == ends, f"the leader to read up to {ends}")  # noqa: B023


def test_wal_records_are_contiguous_across_gaps_and_a_restart_replays_across_them(
    tmp_path: Path, leaders: list[PipelineLeader]
) -> None:
    topic = Topic(partitions=2)
    # Nothing is sealed for an hour: whatever is consumed stays in the buffer and the WAL.
    held = pipeline_config(min_rows=1_000_000, min_age=3600, max_age=3600)
    h = Harness(tmp_path, held, topic)
    first = start(h, leaders)
    assert first.wait_consuming(5.0)
    # Each step is one WAL record, each followed by a marker-like gap; in the second step
    # partition 1 only moves past 3 offsets without a message.
    consume_in_steps(h, first, [{0: 10, 1: 5}, {0: 7, 1: -3}, {0: 3}])
    ends = topic.end_offsets()
    assert ends == {0: 23, 1: 9}
    first.stop(0.0)
    records = wal_ranges(h)
    assert records == [
        {0: OffsetRange(0, 10), 1: OffsetRange(0, 5)},
        {0: OffsetRange(11, 18), 1: OffsetRange(6, 8)},
        {0: OffsetRange(19, 22)},
    ]
    # The next leader on this node replays every message from its WAL, across the gaps,
    # and consumes from the end: nothing is read from Kafka twice.
    h.config = pipeline_config()
    second = start(h, leaders)
    wait_for(lambda: h.fenced.checkpoint.get(TOPIC) == ends, "the checkpoint at the end offsets")
    assert second.status.replayed_rows == len(every_message(topic)) == 25
    assert h.consumers[-1].assigned_from == ends
    assert h.sink.offsets() == every_message(topic)


def test_a_pending_block_across_gaps_is_rebuilt_from_the_wal(
    tmp_path: Path, leaders: list[PipelineLeader]
) -> None:
    topic = Topic(partitions=1)
    # The consumer reads 100 messages a poll: each gap falls between two WAL records.
    for count in (100, 100, 50):
        topic.produce(0, count)
        topic.gap(0, 2)
    h = Harness(tmp_path, pipeline_config(min_rows=250), topic)
    pending = insert_then_lose_the_term(h, leaders)
    assert pending.ranges == {TOPIC: {0: (0, 256)}}
    assert [r[0] for r in wal_ranges(h)] == [
        OffsetRange(0, 101),
        OffsetRange(102, 203),
        OffsetRange(204, 255),
    ]
    second = start(h, leaders)
    wait_for(lambda: h.fenced.checkpoint.get(TOPIC) == {0: 256}, "the re-flush's checkpoint")
    assert h.refetch is not None and h.refetch.calls == 0, "the WAL covered the block"
    assert second.status.refetched_rows == 0
    assert h.sink.offsets() == every_message(topic)
    assert h.consumers[-1].assigned_from == {0: 256}


def test_a_checkpoint_that_would_move_backwards_fails_the_pipeline_and_writes_nothing(
    tmp_path: Path, leaders: list[PipelineLeader]
) -> None:
    topic, h = one_partition(tmp_path, 100)
    leader = start(h, leaders)
    wait_for(lambda: h.fenced.checkpoint.get(TOPIC) == {0: 100}, "the first checkpoint")
    # A second writer (or a bug) moved the checkpoint past what this leader will commit.
    h.fenced.checkpoint = {TOPIC: {0: 10_000}}
    commits = h.fenced.commits
    topic.produce(0, 50)
    wait_for(lambda: leader.status.state is PipelineState.FAILED, "the pipeline to fail")
    error = leader.status.error or ""
    assert "CheckpointRegressionError" in error
    assert "shard 0, pipeline events: checkpoint commit refused" in error
    assert "events[0]: committed 10000, proposed 150" in error
    assert not leader.status.restartable, "a bug or a second writer: ops decide"
    assert h.fenced.checkpoint == {TOPIC: {0: 10_000}} and h.fenced.commits == commits
    assert h.fenced.pending is not None, "the intent stays for whoever looks next"
    assert h.sink.attempts == 2, "the flush was not retried"


def test_a_consumer_reset_below_the_checkpoint_stops_before_anything_is_written(
    tmp_path: Path, leaders: list[PipelineLeader], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The topic was recreated: under out_of_range = "earliest" the consumer starts over at
    # 0, below the checkpoint (50). Offsets 0.. now name other messages than those flushed.
    _topic, h = one_partition(tmp_path, 30)
    h.fenced.checkpoint = {TOPIC: {0: 50}}
    assign = FakeConsumer.assign
    monkeypatch.setattr(FakeConsumer, "assign", lambda self, _starts: assign(self, {}))
    leader = start(h, leaders)
    wait_for(lambda: leader.status.state is PipelineState.FAILED, "the refusal")
    assert ("starts below the committed checkpoint (partition 0 starts at 0, checkpoint 50)") in (
        leader.status.error or ""
    )
    assert not leader.status.restartable
    assert h.fenced.pending is None and h.sink.attempts == 0, "nothing written"


def test_offsets_passed_over_between_messages_are_counted_and_logged(
    tmp_path: Path, leaders: list[PipelineLeader]
) -> None:
    # Partition 0: 50 messages, 5 offsets without one (compaction, an aborted transaction, or
    # a broker that lost a batch), 50 more: one poll of 100 messages spans 105 offsets.
    topic = Topic(partitions=1)
    topic.produce(0, 50)
    topic.gap(0, 5)
    topic.produce(0, 50)
    h = Harness(tmp_path, pipeline_config(), topic)
    with structlog.testing.capture_logs() as logs:
        leader = start(h, leaders)
        wait_for(lambda: h.fenced.checkpoint.get(TOPIC) == {0: 105}, "the checkpoint past it")
    gaps = h.registries[-1].get_sample_value(
        "hakafka_consumer_offset_gaps_total", {"pipeline": "events", "shard": "0", "partition": "0"}
    )
    assert gaps == 5
    assert [
        {k: e[k] for k in ("partition", "first", "end", "offsets")}
        for e in logs
        if e["event"] == "consumer.offset_gap"
    ] == [{"partition": 0, "first": 0, "end": 105, "offsets": 5}]
    assert h.sink.offsets() == every_message(topic)
    leader.stop(0.0)
