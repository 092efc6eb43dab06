"""What the status page reads: the last flushes and buffer limit in `/status` (from a pipeline
run on in-memory parts) and the bounded history behind its charts (`/status/history`)."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

from buffer import OffsetRange
from buffer.table import block_id_for
from hakafka.daemon.history import PipelinePoint, Sample, StatusHistory
from hakafka.daemon.report import pipeline_status
from hakafka.pipeline import PipelineLeader
from hakafka.pipeline.state import RECENT_FLUSHES
from tests.pipeline.fakes import TOPIC, Harness, one_partition, wait_for


def committed_up_to(h: Harness, end: int) -> bool:
    return h.fenced.checkpoint.get(TOPIC) == {0: end}


def newest_flush_is(leader: PipelineLeader, first: int, last: int) -> bool:
    """Whether the status lists the block of offsets `first`..`last` as its newest flush. A
    flush is listed just after its checkpoint commit, so a wait for the commit alone can read
    the status a moment before."""
    flushes = pipeline_status(leader)["recent_flushes"]
    return bool(flushes) and flushes[-1]["block_id"] == block_id_for(
        {(TOPIC, 0): OffsetRange(first, last)}
    )


def test_status_lists_each_committed_block_newest_last(tmp_path: Path) -> None:
    topic, h = one_partition(tmp_path, 100, max_bytes=1 << 20, limit_bytes=2 << 20)
    leader = h.leader()
    leader.start()
    try:
        wait_for(partial(committed_up_to, h, 100), "the first block")
        for end in (150, 180):
            topic.produce(0, end - topic.ends[0])
            wait_for(partial(committed_up_to, h, end), f"the block up to {end}")
        wait_for(partial(newest_flush_is, leader, 150, 179), "the status to list the last block")
        status = json.loads(json.dumps(pipeline_status(leader)))
    finally:
        leader.stop(0.0)
    flushes = status["recent_flushes"]
    assert [(f["block_id"], f["rows"]) for f in flushes] == [
        (block_id_for({(TOPIC, 0): OffsetRange(first, last)}), last - first + 1)
        for first, last in ((0, 99), (100, 149), (150, 179))
    ]
    assert all(f["seconds"] >= 0 and f["at"] > 1.7e9 for f in flushes)
    newest = flushes[-1]
    assert (status["last_flush_at"], status["last_flush_rows"], status["last_flush_seconds"]) == (
        newest["at"],
        30,
        newest["seconds"],
    )
    assert status["buffer_limit_bytes"] == 2 << 20
    assert status["pending_block"] is None


def test_status_keeps_only_the_recent_flushes(tmp_path: Path) -> None:
    topic, h = one_partition(tmp_path, 1)
    leader = h.leader()
    leader.start()
    try:
        for end in range(2, RECENT_FLUSHES + 4):
            wait_for(partial(committed_up_to, h, end - 1), f"the block up to {end - 1}")
            topic.produce(0, 1)
        last = RECENT_FLUSHES + 2
        wait_for(partial(newest_flush_is, leader, last, last), "the status to list the last block")
        flushes = pipeline_status(leader)["recent_flushes"]
    finally:
        leader.stop(0.0)
    assert len(flushes) == RECENT_FLUSHES
    first_kept = 3  # offsets 0..2 were the three oldest blocks, one row each
    assert [f["block_id"] for f in flushes] == [
        block_id_for({(TOPIC, 0): OffsetRange(o, o)})
        for o in range(first_kept, RECENT_FLUSHES + first_kept)
    ]


def point(lag: int, consumed: int = 0, flushed: int = 0) -> PipelinePoint:
    return PipelinePoint("events", 0, lag, consumed, flushed)


def test_history_samples_on_its_cadence_and_keeps_its_window() -> None:
    history = StatusHistory(every_s=5.0, keep_s=20.0)
    due = [t for t in (0.0, 1.0, 4.9, 5.0, 7.0, 10.5, 10.6, 16.0) if history.due(t)]
    assert due == [0.0, 5.0, 10.5, 16.0]  # a late sample moves the next one with it
    for i in range(7):
        history.add(Sample(1000.0 + 5 * i, (point(lag=i, consumed=10 * i, flushed=5 * i),)))
    kept = history.samples()
    assert [s.at for s in kept] == [1010.0, 1015.0, 1020.0, 1025.0, 1030.0]  # 20 s: 5 samples
    report = json.loads(json.dumps(history.report()))
    assert report["every_s"] == 5.0 and report["keep_s"] == 20.0
    assert report["samples"][0] == {
        "at": 1010.0,
        "pipelines": [
            {"pipeline": "events", "shard": 0, "lag": 2, "consumed_rows": 20, "flushed_rows": 10}
        ],
    }


def test_an_empty_history_reports_no_samples() -> None:
    assert StatusHistory().report() == {"every_s": 5.0, "keep_s": 600.0, "samples": []}
