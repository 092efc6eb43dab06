"""Batches pushed into a pipeline beside its Kafka topic: applied once per (writer,
sequence), answered once flushed, refused whole when they do not fit, replayed from the WAL
by the next term. Fakes of Kafka, ZooKeeper and ClickHouse (`fakes.py`)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa
import pytest

from hakafka.config import parse_config
from hakafka.coordination.writers import PUSH_TOPIC
from hakafka.pipeline import PipelineLeader
from hakafka.pipeline.push import (
    PushDesk,
    PushError,
    PushOutOfOrderError,
    PushRefusedError,
    PushRequest,
    PushResult,
    conform,
    first_offset,
)
from tests.helpers.configs import minimal
from tests.pipeline.fakes import (
    TOPIC,
    FakeCopies,
    Harness,
    decoder_for,
    filled_topic,
    pipeline_config,
    start,
    wait_for,
)

PARTITIONS, COUNT = 2, 500


def batch(first: int, rows: int) -> pa.Table:
    return pa.table(
        {
            "user": [f"pushed-{i}" for i in range(first, first + rows)],
            "amount": list(range(first, first + rows)),
        }
    )


def consuming(h: Harness, leaders: list[PipelineLeader]) -> PipelineLeader:
    """A leader of `h`'s current term, started and consuming."""
    leader = start(h, leaders)
    assert leader.wait_consuming(30.0), leader.status
    return leader


def pushed_offsets(h: Harness) -> list[tuple[int, int]]:
    return [(p, o) for p, o in h.sink.offsets() if p < 0]


def kafka_offsets() -> list[tuple[int, int]]:
    return [(p, o) for p in range(PARTITIONS) for o in range(COUNT)]


def test_pushes_land_once_beside_the_topic_and_are_answered_once_flushed(
    tmp_path: Path, leaders: list[PipelineLeader]
) -> None:
    h = Harness(tmp_path, pipeline_config(), filled_topic(PARTITIONS, COUNT))
    leader = consuming(h, leaders)
    assert leader.push("spark-q1-p0", 0, batch(0, 300), timeout=30.0) == PushResult(300, False)
    # Answered only once a checkpoint covers it: the writer's partition is in it, under @push.
    assert h.fenced.checkpoint[PUSH_TOPIC] == {-1: first_offset(0) + 300}
    assert leader.push("spark-q1-p0", 1, batch(300, 200), timeout=30.0) == PushResult(200, False)
    assert leader.push("spark-q1-p1", 0, batch(0, 5), timeout=30.0) == PushResult(5, False)
    # A retry (an answer lost, a restarted Spark task) is applied once.
    assert leader.push("spark-q1-p0", 1, batch(300, 200), timeout=30.0) == PushResult(0, True)
    wait_for(
        lambda: h.fenced.checkpoint.get(TOPIC) == dict.fromkeys(range(PARTITIONS), COUNT),
        "the topic's offsets in the checkpoint",
    )
    assert [(p, o) for p, o in h.sink.offsets() if p >= 0] == kafka_offsets()
    assert pushed_offsets(h) == sorted(
        [(-1, first_offset(0) + i) for i in range(300)]
        + [(-1, first_offset(1) + i) for i in range(200)]
        + [(-2, first_offset(0) + i) for i in range(5)]
    )
    assert h.fenced.writers == {"spark-q1-p0": 0, "spark-q1-p1": 1}
    view = leader.pushes()
    assert (view.rows, view.writers, view.unanswered, view.awaiting_retries) == (505, 2, 0, 0)
    labels = {"pipeline": "events", "shard": "0"}
    assert h.registries[-1].get_sample_value("hakafka_pushed_rows_total", labels) == 505


def test_a_batch_that_does_not_fit_is_refused_whole_with_its_column_and_row(
    tmp_path: Path, leaders: list[PipelineLeader]
) -> None:
    h = Harness(tmp_path, pipeline_config(), filled_topic(1, 1))
    leader = consuming(h, leaders)
    bad = pa.table({"user": ["a", "b", "c"], "amount": ["1", "2", "x3"]})
    with pytest.raises(
        PushError, match=r"column 'amount', row 2 \('x3'\): cannot be read as int64"
    ):
        leader.push("w", 0, bad, timeout=10.0)
    with pytest.raises(PushError, match=r"column 'colour' is not a column of the pipeline"):
        leader.push("w", 0, pa.table({"user": ["a"], "colour": ["red"]}), timeout=10.0)
    nulls = pa.table({"user": ["a", None], "amount": [1, 2]})
    with pytest.raises(PushError, match=r"column 'user', row 1: null in a required column"):
        leader.push("w", 0, nulls, timeout=10.0)
    with pytest.raises(PushError, match=r"invalid writer name 'a b'"):
        leader.push("a b", 0, batch(0, 1), timeout=10.0)
    # Nothing of them was applied: the same sequence goes in afterwards.
    assert leader.push("w", 0, batch(0, 3), timeout=30.0) == PushResult(3, False)


def test_a_push_over_the_buffer_limit_is_refused_with_429_and_nothing_is_lost(
    tmp_path: Path, leaders: list[PipelineLeader]
) -> None:
    # Flushes held (the sink's gate closed): the buffer fills and stays full.
    h = Harness(
        tmp_path, pipeline_config(max_bytes=192 << 10, limit_bytes=192 << 10), filled_topic(1, 1)
    )
    h.sink.gate.clear()
    leader = consuming(h, leaders)
    with ThreadPoolExecutor(1) as pool:
        first: Future[PushResult] = pool.submit(leader.push, "w", 0, batch(0, 1000), 60.0)
        wait_for(lambda: leader.buffer.rows.row_count >= 1000, "the first batch in the buffer")
        # Refused at once, not after the caller's timeout (the buffer waits for a flush).
        began = time.monotonic()
        with pytest.raises(PushRefusedError) as refused:
            leader.push("v", 0, batch(1000, 3000), timeout=10.0)
        assert time.monotonic() - began < 5.0
        assert refused.value.status == 429
        assert "bytes buffered or waiting for the pipeline thread" in str(refused.value)
        assert "would pass the buffer limit (196608)" in str(refused.value)
        h.sink.gate.set()
        assert first.result(60.0) == PushResult(1000, False)
    # A batch larger than the buffer can ever hold is refused as bad input, not as "later".
    with pytest.raises(PushError, match=r"more than the pipeline's buffer holds"):
        leader.push("v", 0, batch(1000, 4000), timeout=10.0)
    # Refused means not applied: pushed again, it is taken.
    assert leader.push("v", 0, batch(1000, 3000), timeout=30.0) == PushResult(3000, False)
    assert len(pushed_offsets(h)) == 4000


def test_the_next_term_replays_pushed_rows_from_the_wal_and_takes_retries_once(
    tmp_path: Path, leaders: list[PipelineLeader]
) -> None:
    # Flushes held: the push is in the WAL and the buffer, not yet answered, when the term
    # ends (a kill -9 keeps the WAL as it is).
    h = Harness(tmp_path, pipeline_config(), filled_topic(1, 10))
    first, pending = held_push(h, leaders)
    wait_for(lambda: first.buffer.rows.row_count >= 60, "the push in the buffer")
    first.stop(0.1)
    with pytest.raises(PushRefusedError, match="push again"):
        pending.result(30.0)
    h.fenced = h.fenced.next_term()
    h.sink.gate.set()
    second = consuming(h, leaders)
    assert second.status.replayed_rows >= 50
    # The writer's retry is the same batch: it was replayed, so it is a duplicate.
    assert second.push("w", 7, batch(0, 50), timeout=30.0) == PushResult(0, True)
    assert pushed_offsets(h) == [(-1, first_offset(7) + i) for i in range(50)]


def test_a_pending_block_whose_pushed_rows_died_with_their_leader_is_rebuilt_from_retries(
    tmp_path: Path, leaders: list[PipelineLeader]
) -> None:
    # The first block holds the topic's 10 rows and the push (min_rows); its insert lands and
    # the term ends before the checkpoint: the push was never answered.
    h = Harness(tmp_path, pipeline_config(min_rows=60), filled_topic(1, 10))
    first, unanswered = held_push(h, leaders)
    wait_for(h.sink.entered.is_set, "the first flush")
    h.fenced.fenced = True
    h.sink.gate.set()
    wait_for(lambda: bool(h.sink.rows), "the insert to land")
    first.stop(5.0)
    with pytest.raises(PushRefusedError, match="push again"):
        unanswered.result(30.0)
    intent = h.fenced.pending
    assert intent is not None and intent.pushed == ((-1, 7, 50),)
    # The next leader is another node: its WAL has neither the rows nor the push.
    h.fenced = h.fenced.next_term()
    h.wal_dir_name = "another-node-wal"
    second = consuming(h, leaders)
    wait_for(
        lambda: any(w.kind == "awaiting_push_retries" for w in second.status.current_waits()),
        "the re-flush to await the writer",
    )
    (wait,) = [w for w in second.status.current_waits() if w.kind == "awaiting_push_retries"]
    assert f"block {intent.block_id} holds pushed batches" in wait.detail
    assert "writer 0 sequence 7 (50 rows)" in wait.detail
    assert second.pushes().awaiting_retries == 1
    assert h.fenced.commits == 0  # nothing flushed before the pending block
    # Not the batch the block holds: refused whole, the block still waits for it.
    with pytest.raises(PushError, match=r"sequence 7 .* applied with 50 rows .* this retry has 3"):
        second.push("w", 7, batch(0, 3), timeout=10.0)
    assert second.push("w", 7, batch(0, 50), timeout=30.0) == PushResult(50, False)
    assert h.fenced.checkpoint[PUSH_TOPIC] == {-1: first_offset(7) + 50}
    # Once in ClickHouse (the same tokens), and the writer goes on from there.
    assert pushed_offsets(h) == [(-1, first_offset(7) + i) for i in range(50)]
    assert [(p, o) for p, o in h.sink.offsets() if p >= 0] == [(0, o) for o in range(10)]
    assert second.push("w", 7, batch(0, 50), timeout=30.0) == PushResult(0, True)
    assert second.push("w", 8, batch(50, 60), timeout=30.0) == PushResult(60, False)
    assert len(pushed_offsets(h)) == 110
    assert not any(w.kind == "awaiting_push_retries" for w in second.status.current_waits())


def held_push(
    h: Harness, leaders: list[PipelineLeader]
) -> tuple[PipelineLeader, Future[PushResult]]:
    """A leader over `h` whose flushes are held (the sink's gate closed), and writer w's batch
    7 (50 rows) pushed to it in the background: applied, not answered."""
    h.sink.gate.clear()
    leader = consuming(h, leaders)
    answer: Future[PushResult] = Future()
    threading.Thread(
        target=lambda: _answer(answer, leader, "w", 7, batch(0, 50)), daemon=True
    ).start()
    return leader, answer


def _answer(
    into: Future[PushResult], leader: PipelineLeader, writer: str, seq: int, table: pa.Table
) -> None:
    try:
        into.set_result(leader.push(writer, seq, table, timeout=30.0))
    except Exception as exc:
        into.set_exception(exc)


def test_conform_checks_values_as_the_kafka_path_does() -> None:
    # A value ClickHouse would refuse never gets into the WAL: a bad push must not become a
    # pending block that no flush can land.
    config = parse_config(
        minimal(
            pipelines=[
                {
                    "name": "events",
                    "topic": TOPIC,
                    "table": "events",
                    "columns": {
                        "id": "UUID",
                        "kind": "Enum8('a' = 1, 'b' = 2)",
                        "note": "Nullable(String)",
                    },
                }
            ]
        )
    )
    schema = decoder_for(config.pipelines[0]).schema
    uuid = "8c5f2c8e-1f3a-4b53-9f0e-2b6c1d4e5f60"
    good = pa.table({"id": [uuid], "kind": ["b"]})
    rows = conform(good, schema, -3, 9)
    assert rows.column("_partition").to_pylist() == [-3]
    assert rows.column("_offset").to_pylist() == [first_offset(9)]
    assert rows.column("note").to_pylist() == [None]  # absent and not required: null
    with pytest.raises(PushError, match=r"column 'id'.*row 1"):
        conform(pa.table({"id": [uuid, "not-a-uuid"], "kind": ["a", "a"]}), schema, -1, 0)
    with pytest.raises(PushError, match=r"column 'kind'.*row 0"):
        conform(pa.table({"id": [uuid], "kind": ["c"]}), schema, -1, 0)
    with pytest.raises(PushError, match=r"column 'id' is given twice"):
        conform(
            pa.Table.from_arrays([pa.array([uuid]), pa.array([uuid])], ["id", "id"]), schema, -1, 0
        )


def test_the_desk_bounds_what_waits_and_forgets_pushes_given_up() -> None:
    rows = pa.record_batch({"a": pa.array(range(1000), pa.int64())})
    one = PushRequest(-1, 0, rows)
    limit = one.nbytes * 2
    desk = PushDesk(lambda: limit)
    desk.submit(one)
    desk.submit(two := PushRequest(-3, 0, rows))
    # A third would pass the limit while the pipeline thread is held: 429 at once.
    desk.submit(three := PushRequest(-2, 0, rows))
    with pytest.raises(PushRefusedError, match="would pass the buffer limit") as refused:
        three.done.result(0)
    assert refused.value.status == 429
    # A caller that gave up (its timeout) is not applied: it will push again.
    assert two.done.cancel()
    assert desk.take() == [one]
    desk.applied(one, PushResult(1000, False))
    assert not one.done.done()  # waits for the checkpoint
    desk.committed({-1: one.end})
    assert one.done.result(0) == PushResult(1000, False)
    # While the pipeline thread waits for a flush at the buffer's limit it takes no push:
    # the queued ones and new ones get 429 at once, until a flush makes room.
    desk.submit(queued := PushRequest(-2, 0, rows))
    desk.hold("2000 bytes buffered of 2000")
    desk.submit(later := PushRequest(-2, 0, rows))
    for refused_now in (queued, later):
        with pytest.raises(PushRefusedError, match=r"the buffer is full \(2000 bytes") as full:
            refused_now.done.result(0)
        assert full.value.status == 429
    desk.release()
    # Taken, the queue's bytes count no more.
    desk.submit(four := PushRequest(-2, 0, rows))
    assert not four.done.done()
    desk.close("stopped")
    with pytest.raises(PushRefusedError, match="push again"):
        four.done.result(0)


def test_a_batch_pushed_after_a_higher_one_is_refused_not_taken_for_a_retry(
    tmp_path: Path, leaders: list[PipelineLeader]
) -> None:
    # Two pushers with one writer id: sequence 3 reaches the leader after 5 was applied.
    # It was answered as a duplicate (a retry) and lost.
    h = Harness(tmp_path, pipeline_config(), filled_topic(1, 1))
    leader = consuming(h, leaders)
    assert leader.push("w", 1, batch(0, 10), timeout=30.0) == PushResult(10, False)
    assert leader.push("w", 5, batch(10, 10), timeout=30.0) == PushResult(10, False)
    with pytest.raises(PushOutOfOrderError, match=r"sequence 3 of this writer is below"):
        leader.push("w", 3, batch(20, 10), timeout=30.0)
    # Retries of applied batches are still duplicates; below what the term remembers, a
    # batch cannot be told from a retry (the contract: one batch in flight per writer).
    assert leader.push("w", 5, batch(10, 10), timeout=30.0) == PushResult(0, True)
    assert leader.push("w", 1, batch(0, 10), timeout=30.0) == PushResult(0, True)
    assert leader.push("w", 0, batch(0, 10), timeout=30.0) == PushResult(0, True)
    assert leader.push("w", 6, batch(20, 10), timeout=30.0) == PushResult(10, False)
    assert pushed_offsets(h) == sorted(
        (-1, first_offset(seq) + i) for seq in (1, 5, 6) for i in range(10)
    )


def test_a_push_copied_to_another_node_is_answered_before_its_flush(
    tmp_path: Path, leaders: list[PipelineLeader]
) -> None:
    h = Harness(tmp_path, pipeline_config(), filled_topic(1, 1), copies=FakeCopies())
    h.sink.gate.clear()  # nothing flushes
    leader = consuming(h, leaders)
    assert leader.push("w", 0, batch(0, 50), timeout=10.0) == PushResult(50, False)
    assert PUSH_TOPIC not in h.fenced.checkpoint  # answered, not flushed
    assert h.copies is not None and list(h.copies.held) == [(-1, 0)]
    assert leader.pushes().copying == 0
    labels = {"pipeline": "events", "shard": "0", "outcome": "copied"}
    assert h.registries[-1].get_sample_value("hakafka_push_copies_total", labels) == 1
    # No node takes the copy: the flush answers.
    h.copies.stores = False
    with ThreadPoolExecutor(1) as pool:
        flushed = pool.submit(leader.push, "w", 1, batch(50, 20), 60.0)
        with pytest.raises(TimeoutError):
            flushed.result(1.0)
        h.sink.gate.set()
        assert flushed.result(60.0) == PushResult(20, False)
    assert h.fenced.checkpoint[PUSH_TOPIC] == {-1: first_offset(1) + 20}


def test_with_push_acks_0_the_leaders_wal_alone_answers(
    tmp_path: Path, leaders: list[PipelineLeader]
) -> None:
    h = Harness(tmp_path, pipeline_config(push_acks=0), filled_topic(1, 1))
    h.sink.gate.clear()
    leader = consuming(h, leaders)
    assert leader.push("w", 0, batch(0, 5), timeout=10.0) == PushResult(5, False)
    assert PUSH_TOPIC not in h.fenced.checkpoint


def test_a_new_leader_without_the_old_ones_disk_flushes_answered_pushes_from_copies(
    tmp_path: Path, leaders: list[PipelineLeader]
) -> None:
    h = Harness(tmp_path, pipeline_config(), filled_topic(1, 10), copies=FakeCopies())
    h.sink.gate.clear()
    first = consuming(h, leaders)
    assert first.push("w", 3, batch(0, 50), timeout=10.0) == PushResult(50, False)
    assert first.push("w", 4, batch(50, 30), timeout=10.0) == PushResult(30, False)
    first.stop(0.1)  # its node dies with its disk
    h.fenced = h.fenced.next_term()
    h.wal_dir_name = "another-node-wal"
    h.sink.gate.set()
    second = consuming(h, leaders)
    wait_for(
        lambda: h.fenced.checkpoint.get(PUSH_TOPIC) == {-1: first_offset(4) + 30},
        "the recovered batches flushed",
    )
    assert pushed_offsets(h) == sorted(
        [(-1, first_offset(3) + i) for i in range(50)]
        + [(-1, first_offset(4) + i) for i in range(30)]
    )
    # The writer goes on; a late retry of an answered batch is a duplicate.
    assert second.push("w", 4, batch(50, 30), timeout=30.0) == PushResult(0, True)
    assert second.push("w", 5, batch(80, 5), timeout=30.0) == PushResult(5, False)


def test_a_pending_block_is_rebuilt_from_copies_without_waiting_for_writers(
    tmp_path: Path, leaders: list[PipelineLeader]
) -> None:
    h = Harness(tmp_path, pipeline_config(min_rows=60), filled_topic(1, 10), copies=FakeCopies())
    first, answered = held_push(h, leaders)
    assert answered.result(30.0) == PushResult(50, False)  # copied, then its block flushes
    wait_for(h.sink.entered.is_set, "the first flush")
    h.fenced.fenced = True
    h.sink.gate.set()
    wait_for(lambda: bool(h.sink.rows), "the insert to land")
    first.stop(5.0)
    h.fenced = h.fenced.next_term()
    h.wal_dir_name = "another-node-wal"
    consuming(h, leaders)
    wait_for(lambda: PUSH_TOPIC in h.fenced.checkpoint, "the pending block re-flushed")
    assert h.fenced.checkpoint[PUSH_TOPIC] == {-1: first_offset(7) + 50}
    assert pushed_offsets(h) == [(-1, first_offset(7) + i) for i in range(50)]
