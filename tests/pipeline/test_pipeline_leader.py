"""`PipelineLeader`'s flush / commit / abandon / backpressure protocol, driven with in-memory
parts (tests/pipeline/fakes.py): no ZooKeeper, Kafka, Spark or ClickHouse.

Each test checks what users rely on: every (`_partition`, `_offset`) once in the table, the
checkpoint at the exact end offsets, nothing committed by a leader whose term is over.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from buffer import BufferFull, MemoryTable
from hakafka.pipeline import PipelineLeader, PipelineState
from hakafka.pipeline.state import Signals
from tests.pipeline.fakes import (
    TOPIC,
    Harness,
    Topic,
    decoder_rows,
    insert_then_lose_the_term,
    one_partition,
    pipeline_config,
    start,
    wait_for,
)
from wal import Position, Record, WriteAheadLog


def every_offset(topic: Topic) -> list[tuple[int, int]]:
    return sorted((p, o) for p, log in topic.logs.items() for o in range(len(log)))


def test_consumes_flushes_and_commits_every_offset_once(
    tmp_path: Path, leaders: list[PipelineLeader]
) -> None:
    topic = Topic(partitions=2)
    topic.produce(0, 250, bad=[7])
    topic.produce(1, 130)
    h = Harness(tmp_path, pipeline_config(), topic)
    leader = start(h, leaders)
    assert leader.wait_consuming(5.0)
    wait_for(lambda: h.fenced.checkpoint.get(TOPIC) == {0: 250, 1: 130}, "the checkpoint")
    wait_for(lambda: leader.buffer.rows.row_count == 0, "the buffer to empty")
    good = [(p, o) for p, o in every_offset(topic) if (p, o) != (0, 7)]
    assert h.sink.offsets() == good
    assert h.sink.dead_offsets() == [(0, 7)]
    assert h.fenced.pending is None
    assert leader.status.checkpoint == {0: 250, 1: 130}
    assert leader.lag() == {0: 0, 1: 0}
    # Each committed checkpoint is mirrored (to the Kafka consumer group), in order.
    assert h.mirror.published[-1] == {0: 250, 1: 130}
    for earlier, later in itertools.pairwise(h.mirror.published):
        assert all(later[p] >= o for p, o in earlier.items())
    assert h.catalog.names() == ["events", "events_dead_letter"]
    assert leader.stop(1.0)
    assert leader.status.state is PipelineState.STOPPED
    assert h.consumers[0].closed and h.mirror.closed
    assert h.catalog.names() == []


def test_next_leader_reflushes_pending_from_its_wal_with_the_same_block_id(
    tmp_path: Path, leaders: list[PipelineLeader]
) -> None:
    # The leader inserts a block, then its term ends before the checkpoint (killed, fenced):
    # the next leader on the same node flushes the same block id from the WAL again.
    topic, h = one_partition(tmp_path, 100)
    pending = insert_then_lose_the_term(h, leaders)
    assert h.sink.offsets() == every_offset(topic)  # it landed, uncommitted
    second = start(h, leaders)
    wait_for(lambda: h.fenced.checkpoint.get(TOPIC) == {0: 100}, "the re-flush's checkpoint")
    time.sleep(0.2)  # nothing more may happen: no other block exists
    assert h.sink.attempts == 2  # the same block again: the sink kept the first insert
    assert h.fenced.commits == 1
    assert second.status.replayed_rows == 0  # the pending block's rows are not replayed
    assert list(h.sink.rows) == [task.key for task in pending.tasks]
    assert h.sink.offsets() == every_offset(topic)
    assert h.refetch is not None and h.refetch.calls == 0
    assert second.status.refetched_rows == 0
    # Consumption resumes after the pending block, not from the old checkpoint.
    assert h.consumers[-1].assigned_from == {0: 100}


def test_pending_block_missing_from_the_wal_is_refetched_from_kafka(
    tmp_path: Path, leaders: list[PipelineLeader]
) -> None:
    _topic, h = one_partition(tmp_path, 60, bad=[3])
    insert_then_lose_the_term(h, leaders)
    h.wal_dir_name = "another-node-wal"  # the next leader is another node: no local rows
    second = start(h, leaders)
    wait_for(lambda: h.fenced.checkpoint.get(TOPIC) == {0: 60}, "the re-flush's checkpoint")
    assert h.refetch is not None and h.refetch.calls == 1
    assert second.status.refetched_rows == 59
    assert h.sink.offsets() == [(0, o) for o in range(60) if o != 3]
    assert h.sink.dead_offsets() == [(0, 3)]


def test_full_buffer_pauses_the_consumer_until_a_flush_commits(
    tmp_path: Path, leaders: list[PipelineLeader]
) -> None:
    topic = Topic(partitions=1)
    topic.produce(0, 2_000)
    # A tiny buffer: the first batch fills it, the next ones wait for a commit.
    h = Harness(tmp_path, pipeline_config(max_bytes=1 << 10, limit_bytes=1 << 10), topic)
    h.sink.gate.clear()
    leader = start(h, leaders)
    wait_for(h.sink.entered.is_set, "the first flush")
    wait_for(lambda: bool(h.consumers) and h.consumers[0].paused, "the consumer to pause")
    held = leader.buffer.rows.row_count
    assert 0 < held < 2_000
    h.sink.gate.set()
    wait_for(lambda: h.fenced.checkpoint.get(TOPIC) == {0: 2_000}, "every offset committed")
    assert not h.consumers[0].paused
    assert h.consumers[0].pauses >= 1
    assert h.sink.offsets() == every_offset(topic)


def test_stop_abandons_a_flush_that_outlasts_the_grace(
    tmp_path: Path, leaders: list[PipelineLeader]
) -> None:
    _topic, h = one_partition(tmp_path, 50)
    h.sink.gate.clear()
    leader = start(h, leaders)
    wait_for(h.sink.entered.is_set, "the flush")
    assert leader.stop(0.2) is False  # still in flight after the grace: abandoned
    h.sink.gate.set()
    wait_for(lambda: not leader.running, "the pipeline thread to end")
    # The insert may land (it is idempotent) but the abandoned block is never committed.
    wait_for(lambda: h.catalog.names() == [], "both threads to end")
    assert h.sink.attempts == 1 and bool(h.sink.rows)
    assert h.fenced.commits == 0
    assert h.fenced.pending is not None


def test_failed_flushes_are_retried_until_clickhouse_takes_the_block(
    tmp_path: Path, leaders: list[PipelineLeader], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("hakafka.pipeline.flush.BACKOFF_INITIAL_S", 0.01)
    _topic, h = one_partition(tmp_path, 40)
    h.sink.fail(3)
    leader = start(h, leaders)
    wait_for(lambda: h.fenced.checkpoint.get(TOPIC) == {0: 40}, "the checkpoint")
    assert h.sink.attempts == 4
    assert h.fenced.commits == 1
    assert leader.status.state is PipelineState.CONSUMING


def test_suspended_leader_writes_nothing_until_resumed(
    tmp_path: Path, leaders: list[PipelineLeader]
) -> None:
    topic = Topic(partitions=1)
    h = Harness(tmp_path, pipeline_config(), topic)
    leader = start(h, leaders)
    assert leader.wait_consuming(5.0)
    leader.suspend()
    topic.produce(0, 30)
    time.sleep(0.5)  # what a suspended leader must not do cannot be waited for: give it time
    # Suspended: nothing is consumed, no intent written, nothing flushed.
    assert h.fenced.pending is None and h.sink.attempts == 0
    assert h.consumers[0].next == {0: 0}
    leader.resume()
    wait_for(lambda: h.fenced.checkpoint.get(TOPIC) == {0: 30}, "the checkpoint after resume")
    assert h.sink.offsets() == every_offset(topic)


def test_bad_message_with_on_error_fail_fails_for_good(
    tmp_path: Path, leaders: list[PipelineLeader]
) -> None:
    _topic, h = one_partition(tmp_path, 10, bad=[4], on_error="fail")
    leader = start(h, leaders)
    wait_for(lambda: not leader.running, "the pipeline to fail")
    assert leader.status.state is PipelineState.FAILED
    assert leader.status.restartable is False
    assert "offset 4" in (leader.status.error or "")
    assert h.fenced.commits == 0


def test_new_leader_consumes_while_its_pending_block_is_reflushed(
    tmp_path: Path, leaders: list[PipelineLeader]
) -> None:
    # Consuming and buffer queries never wait for Spark or ClickHouse: the re-flush of the
    # pending block runs in the flush lane, and the next block is sealed after it commits.
    topic, h = one_partition(tmp_path, 100)
    pending = insert_then_lose_the_term(h, leaders)
    topic.produce(0, 50)
    h.sink.gate.clear()
    h.sink.entered.clear()
    second = start(h, leaders)
    assert second.wait_consuming(5.0), "the new leader waited for its re-flush"
    wait_for(h.sink.entered.is_set, "the re-flush")
    wait_for(lambda: second.buffer.rows.row_count == 50, "the new rows in the buffer")
    assert second.status.reflushing and second.status.pending_block == pending.block_id
    assert h.fenced.checkpoint == {}
    h.sink.gate.set()
    wait_for(lambda: h.fenced.checkpoint.get(TOPIC) == {0: 150}, "both blocks committed")
    first_block, second_block = h.sink.rows  # in flush order: the pending block first
    assert [first_block] == [task.key for task in pending.tasks]
    assert h.sink.rows[second_block].column("_offset").to_pylist() == list(range(100, 150))
    assert h.sink.offsets() == every_offset(topic)
    assert not second.status.reflushing


def test_a_flush_lane_that_ends_stops_the_whole_pipeline(
    tmp_path: Path, leaders: list[PipelineLeader]
) -> None:
    # A FencedError while ZooKeeper is suspended ends the flush lane; the consume lane must
    # not go on filling a buffer that nothing drains (and keep counting as healthy).
    _topic, h = one_partition(tmp_path, 30)
    h.fenced.refuse_writes = True
    leader = start(h, leaders)
    wait_for(lambda: not leader.running, "the pipeline to stop with its flush lane")
    assert leader.status.state is PipelineState.STOPPED
    assert h.fenced.commits == 0 and h.sink.attempts == 0


def test_a_pipeline_that_cannot_start_fails_and_stops_cleanly(
    tmp_path: Path, leaders: list[PipelineLeader]
) -> None:
    h = Harness(tmp_path, pipeline_config(), Topic(partitions=1), release_wait_s=0.5)
    first = start(h, leaders)  # holds shard 0's part of `events`
    assert first.wait_consuming(30.0), first.status
    h.wal_dir_name = "wal-2"
    second = start(h, leaders)
    wait_for(lambda: not second.running, "the second instance to give up")
    assert second.status.state is PipelineState.FAILED
    assert second.status.error == (
        "PreviousInstanceError: this node's previous instance of the pipeline did not let go "
        "within 0.5 s: a table named 'events' of shard 0 is already in the catalog"
    )
    assert second.status.restartable
    assert second.stop(0.0)
    assert first.status.state is PipelineState.CONSUMING  # still serving its names


def test_a_new_instance_waits_for_the_previous_one_to_let_go_and_says_so(
    tmp_path: Path, leaders: list[PipelineLeader]
) -> None:
    # A stopped instance whose flush was abandoned holds the buffer's names (and the WAL)
    # until its insert returns. The new term's instance failed at once, three times in a few
    # seconds, and the node handed the shard over (the short chaos run, during a reshard).
    _topic, h = one_partition(tmp_path, 30)
    held = MemoryTable("events", h.leader().buffer.rows.schema, 1 << 20)
    h.catalog.add(held, 0)
    with structlog.testing.capture_logs() as logs:
        leader = start(h, leaders)
        wait_for(lambda: leader.state_name() == "awaiting_previous_instance", "the wait, named")
        (wait,) = leader.status.current_waits()
        wait_for(lambda: time.monotonic() - wait.since > 0.7, "a few more polls (0.2 s apart)")
    assert wait.detail == "a table named 'events' of shard 0 is already in the catalog"
    # Logged once as it begins, not at every poll.
    assert [e["held"] for e in logs if e["event"] == "pipeline.awaiting_previous_instance"] == [
        wait.detail
    ]
    h.catalog.discard(held)  # the previous instance lets go
    assert leader.wait_consuming(30.0), leader.status
    assert leader.status.error is None and not leader.status.waits
    wait_for(lambda: h.fenced.checkpoint.get(TOPIC) == {0: 30}, "the rows flushed")


def test_a_commit_between_buffer_full_and_the_wait_is_not_lost(tmp_path: Path) -> None:
    # The flush lane commits right after the buffer refused a batch and before the consume
    # lane waits: the batch must go in at once, not wait for a commit that already happened.
    h = Harness(tmp_path, pipeline_config(), Topic(partitions=1))
    lane = h.consume_lane()
    refusals: list[int] = []

    def full_once(rows: object, dead: object, ranges: object) -> None:
        if not refusals:
            refusals.append(1)
            lane.context.signals.note_commit()  # the flush lane, between refusal and wait
            raise BufferFull("events", 1, 1, 1)
        appended.append(ranges)

    appended: list[object] = []
    lane.context.buffer.append = full_once  # type: ignore[method-assign]
    batch = decoder_rows(h)
    done = threading.Thread(target=lane.append, args=(batch, None, {}), daemon=True)
    done.start()
    done.join(timeout=2.0)
    lane.context.signals.stop.set()
    assert not done.is_alive() and appended == [{}], "the commit's wake-up was lost"


def test_flushes_failing_show_as_stalled_with_clickhouses_error_and_go_on(
    tmp_path: Path, leaders: list[PipelineLeader], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("hakafka.pipeline.flush.BACKOFF_INITIAL_S", 0.01)
    monkeypatch.setattr("hakafka.pipeline.flush.BACKOFF_MAX_S", 0.05)
    _topic, h = one_partition(tmp_path, 20)
    h.sink.fail(10**9)  # ClickHouse rejects this block, always
    leader = start(h, leaders)
    wait_for(lambda: h.sink.attempts >= 3, "retries")
    time.sleep(0.5)
    assert leader.stalled_for(time.monotonic()) >= 0.5
    assert "ClickHouse is away" in (leader.status.flush_error or "")
    assert leader.status.state is PipelineState.CONSUMING  # still retrying, not failed
    attempts = h.sink.attempts
    wait_for(lambda: h.sink.attempts > attempts, "the retries to go on")
    h.sink.fail(0)
    wait_for(lambda: h.fenced.commits == 1, "the block to land once ClickHouse takes it")
    assert leader.status.flush_error is None
    assert leader.stalled_for(time.monotonic()) < 0.5


def test_a_paused_consumer_with_no_flush_committing_is_stalled(
    tmp_path: Path, leaders: list[PipelineLeader], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Its threads keep stepping (they poll), but nothing moves: that is no progress. The
    # threads' own beats are left out, so only the paused-consumer rule can see it.
    monkeypatch.setattr(Signals, "stalled_for", lambda _self, _now: 0.0)
    _topic, h = one_partition(tmp_path, 2_000, max_bytes=1 << 10, limit_bytes=1 << 10)
    h.sink.gate.clear()  # a flush that hangs, without an error
    leader = start(h, leaders)
    wait_for(lambda: bool(h.consumers) and h.consumers[0].paused, "the consumer to pause")
    time.sleep(0.5)
    assert leader.stalled_for(time.monotonic()) >= 0.5
    h.sink.gate.set()
    wait_for(lambda: h.fenced.checkpoint.get(TOPIC) == {0: 2_000}, "every offset committed")
    assert leader.stalled_for(time.monotonic()) < 0.5


def test_a_block_in_flight_that_never_commits_is_stalled_though_every_thread_steps(
    tmp_path: Path, leaders: list[PipelineLeader], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A new leader's first flush waiting for its Spark session to start: the flush lane
    # steps all the while (the threads' own beats are left out), the consumer is not paused,
    # nothing fails; but no data lands. Seen in the chaos run: ready while stuck for 41 s.
    monkeypatch.setattr(Signals, "stalled_for", lambda _self, _now: 0.0)
    _topic, h = one_partition(tmp_path, 20)
    h.sink.gate.clear()  # the flush does not end, without an error
    leader = start(h, leaders)
    wait_for(h.sink.entered.is_set, "the block in flight")
    time.sleep(0.5)
    now = time.monotonic()
    assert leader.stalled_for(now) >= 0.5
    assert leader.stall_reason(now).startswith("a block in flight for ")
    assert leader.stall_reason(now).endswith(" s has not committed")
    h.sink.gate.set()
    wait_for(lambda: h.fenced.commits == 1, "the block to land")
    assert leader.stalled_for(time.monotonic()) < 0.5


def test_new_leader_replays_what_the_old_one_consumed_after_its_pending_block(
    tmp_path: Path, leaders: list[PipelineLeader], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The old leader went on consuming while its first block was in flight: those offsets are
    # in its WAL, after the pending block. The next leader on this node flushes the pending
    # block and replays the rest, each offset once.
    topic, h = one_partition(tmp_path, 100)

    def consume_on(first: PipelineLeader) -> None:
        topic.produce(0, 70)
        wait_for(lambda: first.positions() == {0: 170}, "the old leader to consume on")

    pending_end = insert_then_lose_the_term(h, leaders, consume_on).ranges[TOPIC][0][1]
    passes = count_wal_passes(monkeypatch)
    second = start(h, leaders)
    wait_for(lambda: h.fenced.checkpoint.get(TOPIC) == {0: 170}, "both blocks committed")
    assert second.status.replayed_rows == 170 - pending_end
    assert h.consumers[-1].assigned_from == {0: 170}
    assert h.sink.offsets() == every_offset(topic)
    # The pending block came from the WAL (not Kafka) in the same pass as the replay.
    assert h.refetch is not None and h.refetch.calls == 0
    assert passes == [None]


def count_wal_passes(monkeypatch: pytest.MonkeyPatch) -> list[Position | None]:
    """The `start` of every `WriteAheadLog.replay` call from now on."""
    calls: list[Position | None] = []
    replay = WriteAheadLog.replay

    def counted(wal: WriteAheadLog, start: Position | None = None) -> Iterator[Record]:
        calls.append(start)
        return replay(wal, start)

    monkeypatch.setattr(WriteAheadLog, "replay", counted)
    return calls


def test_tables_come_before_the_pending_reflush_and_their_failures_are_retried(
    tmp_path: Path, leaders: list[PipelineLeader], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("hakafka.pipeline.flush.BACKOFF_INITIAL_S", 0.01)
    _topic, h = one_partition(tmp_path, 40)
    insert_then_lose_the_term(h, leaders)
    attempts = h.sink.attempts
    h.sink.table_failures = 3
    second = start(h, leaders)
    assert second.wait_consuming(5.0)  # consuming does not wait for ClickHouse
    wait_for(lambda: h.fenced.checkpoint.get(TOPIC) == {0: 40}, "the re-flush after the tables")
    assert h.sink.table_failures == 0 and h.sink.tables_ensured == 2
    assert h.sink.attempts == attempts + 1  # no flush was tried before the tables existed
