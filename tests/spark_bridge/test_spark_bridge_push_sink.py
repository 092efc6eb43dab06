"""The `hakafka` Spark sink's task: which writer and sequence each pushed batch gets (the same
on every run of the task, so a retried task or a restarted query is applied once), how rows
are routed to shards, and its options' errors. Pushes go to an in-memory stand-in."""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa
import pytest

from buffer.push_client import Pushed
from spark_bridge.push_sink import PushOptions, TaskPushed, push_task

OPTIONS = {"urls": "http://n1:8300,grpc://n2:8301", "pipeline": "events", "writer": "job7"}


@dataclass
class Recorder:
    """Every push as (shard, writer, sequence, ids); a (writer, sequence) seen before is
    answered as a duplicate, as the leader does."""

    pushed: list[tuple[int, str, int, list[int]]] = field(default_factory=list)

    def __call__(self, options: PushOptions, shard: int, writer: str) -> Recorder.One:
        return Recorder.One(self, shard, writer)

    @dataclass
    class One:
        recorder: Recorder
        shard: int
        writer: str

        def push(self, sequence: int, batch: pa.Table) -> Pushed:
            seen = {(w, s) for _, w, s, _ in self.recorder.pushed}
            ids = batch.column("id").to_pylist()
            self.recorder.pushed.append((self.shard, self.writer, sequence, ids))
            if (self.writer, sequence) in seen:
                return Pushed(0, True, 1)
            return Pushed(len(ids), False, 1)

        def close(self) -> None:
            pass


def rows(n: int) -> list[pa.RecordBatch]:
    table = pa.table({"id": list(range(n)), "user": [f"u{i % 7}" for i in range(n)]})
    return list(table.to_batches(max_chunksize=4))


def test_a_micro_batch_is_cut_into_sequences_from_its_batch_id_and_a_rerun_is_applied_once() -> (
    None
):
    options = PushOptions.parse({**OPTIONS, "batch_rows": "5", "shards": "2"})
    recorder = Recorder()
    assert push_task(options, 3, 12, iter(rows(12)), recorder) == TaskPushed(12, 0)
    first = 12 << 20
    # Task 3 of 2 shards goes to shard 1; batches of 5 rows.
    assert [(s, w, q, len(ids)) for s, w, q, ids in recorder.pushed] == [
        (1, "job7-t3-s1", first, 5),
        (1, "job7-t3-s1", first + 1, 5),
        (1, "job7-t3-s1", first + 2, 2),
    ]
    # The query restarted: batch 12 again, the same rows: every batch a duplicate.
    assert push_task(options, 3, 12, iter(rows(12)), recorder) == TaskPushed(0, 3)
    # A batch write numbers from 0.
    assert push_task(options, 0, None, iter(rows(3)), recorder) == TaskPushed(3, 0)
    assert recorder.pushed[-1][:3] == (0, "job7-t0-s0", 0)
    assert push_task(options, 0, None, iter([]), recorder) == TaskPushed(0, 0)


def test_a_key_column_routes_each_row_to_one_shard_the_same_way_every_time() -> None:
    options = PushOptions.parse({**OPTIONS, "shards": "3", "key": "user"})
    first, again = Recorder(), Recorder()
    push_task(options, 0, 1, iter(rows(40)), first)
    push_task(options, 5, 1, iter(rows(40)), again)
    by_shard = {s: ids for s, _, _, ids in first.pushed}
    assert sorted(i for ids in by_shard.values() for i in ids) == list(range(40))
    assert {s: ids for s, _, _, ids in again.pushed} == by_shard  # not by task
    # One user's rows all in one shard.
    user_shard = {f"u{i % 7}": s for s, ids in by_shard.items() for i in ids}
    assert len(user_shard) == 7 and len(by_shard) > 1
    with pytest.raises(ValueError, match=r"option 'key': no column 'nope'"):
        push_task(
            PushOptions.parse({**OPTIONS, "shards": "2", "key": "nope"}),
            0,
            1,
            iter(rows(2)),
            Recorder(),
        )


@pytest.mark.parametrize(
    ("given", "error"),
    [
        ({"pipeline": "events", "writer": "w"}, r"option 'urls' is required"),
        ({**OPTIONS, "writer": ""}, r"option 'writer' is required \(a name for this job's writers"),
        (
            {**OPTIONS, "urls": "n1:8300"},
            r"option 'urls': 'n1:8300' is not an http\(s\):// or grpc://",
        ),
        ({**OPTIONS, "shards": "0"}, r"option 'shards': expected an integer >= 1, got '0'"),
    ],
)
def test_options_name_what_is_missing_or_wrong(given: dict[str, str], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        PushOptions.parse(given)
