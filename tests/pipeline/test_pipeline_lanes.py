"""Several lanes: each a real process reading its part of a fake topic, the pipeline thread
the WAL's only writer. Offsets land once, a lane that raises fails the term, and the next
term (one lane or several) delivers the rest once."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from hakafka.consumer import DecodeError
from hakafka.ops.status import lag_by_lane
from hakafka.pipeline import PipelineLeader, PipelineState
from hakafka.pipeline.lane_process import LaneFailedError, sendable
from hakafka.pipeline.lane_rates import LaneRates
from tests.pipeline.fakes import (
    TOPIC,
    Harness,
    LaneTopic,
    filled_topic,
    lane_parts,
    pipeline_config,
    start,
    wait_for,
)

PARTITIONS, COUNT = 4, 3_000


def every_offset() -> list[tuple[int, int]]:
    return [(p, o) for p in range(PARTITIONS) for o in range(COUNT)]


@pytest.mark.parametrize("lanes", [2, 3])
def test_lanes_land_every_offset_once_from_the_first_batch_of_each(
    lanes: int, tmp_path: Path, leaders: list[PipelineLeader]
) -> None:
    config = pipeline_config()
    h = Harness(tmp_path, config, filled_topic(PARTITIONS, COUNT))
    h.lanes = lane_parts(config, LaneTopic(PARTITIONS, COUNT, late=1.0), lanes)
    leader = start(h, leaders)
    assert leader.wait_consuming(60.0), leader.status
    wait_for(
        lambda: h.fenced.checkpoint.get(TOPIC) == dict.fromkeys(range(PARTITIONS), COUNT),
        "every lane's offsets in the checkpoint",
    )
    wait_for(lambda: leader.buffer.rows.row_count == 0, "the buffer to empty")
    # A lane ready before the others reads on: its first batches count too.
    assert h.sink.offsets() == every_offset()
    assert leader.lag() == dict.fromkeys(range(PARTITIONS), 0)
    # Ranks modulo the lane count: lane i reads partitions i, i + lanes, ...; every row once.
    views = leader.lanes()
    assert [(v.lane, v.partitions) for v in views] == [
        (i, list(range(i, PARTITIONS, lanes))) for i in range(lanes)
    ]
    assert [v.rows for v in views] == [COUNT * len(v.partitions) for v in views]
    labels = {"pipeline": "events", "shard": "0"}
    assert h.registries[-1].get_sample_value("hakafka_pipeline_lanes", labels) == lanes
    for v in views:
        lane_labels = {**labels, "lane": str(v.lane)}
        assert h.registries[-1].get_sample_value("hakafka_lane_rows_total", lane_labels) == v.rows
    assert leader.stop(5.0)
    assert h.registries[-1].get_sample_value("hakafka_pipeline_lanes", labels) == 0
    assert leader.status.state is PipelineState.STOPPED


def test_a_slow_lane_holds_back_neither_the_fast_lanes_flushes_nor_its_own(
    tmp_path: Path, leaders: list[PipelineLeader]
) -> None:
    # A buffer that fills: the fast lane meets backpressure again and again while the slow
    # one (a poll every 0.2 s: 6,000 offsets in about 6 s) still reads.
    config = pipeline_config(max_bytes=32 << 10, limit_bytes=64 << 10)
    h = Harness(tmp_path, config, filled_topic(PARTITIONS, COUNT))
    h.lanes = lane_parts(config, LaneTopic(PARTITIONS, COUNT, slow=0.2), 2)
    leader = start(h, leaders)
    assert leader.wait_consuming(60.0), leader.status
    fast, slow = [1, 3], [0, 2]

    def checkpointed(partitions: list[int]) -> list[int]:
        offsets = h.fenced.checkpoint.get(TOPIC, {})
        return [offsets.get(p, 0) for p in partitions]

    wait_for(lambda: checkpointed(fast) == [COUNT, COUNT], "the fast lane's rows flushed", 30.0)
    # The fast lane's rows did not wait for the slow lane's ...
    behind = checkpointed(slow)
    assert min(behind) < COUNT, behind
    # ... and the slow lane's batches went on landing meanwhile and after.
    wait_for(lambda: checkpointed(slow) == [COUNT, COUNT], "the slow lane's rows flushed", 60.0)
    wait_for(lambda: leader.buffer.rows.row_count == 0, "the buffer to empty")
    assert h.sink.offsets() == every_offset()
    read = {v.lane: v.rows for v in leader.lanes()}
    assert read == {0: 2 * COUNT, 1: 2 * COUNT}


def test_offset_resets_in_lane_processes_are_counted(
    tmp_path: Path, leaders: list[PipelineLeader]
) -> None:
    # Retention passed the checkpoint (10) on every partition: each lane's consumer resets
    # its partitions to the log's start (100), and the daemon's counters see every reset.
    config = pipeline_config()
    h = Harness(tmp_path, config, filled_topic(PARTITIONS, COUNT))
    h.fenced.checkpoint = {TOPIC: dict.fromkeys(range(PARTITIONS), 10)}
    h.lanes = lane_parts(config, LaneTopic(PARTITIONS, COUNT, log_start=100), 2)
    start(h, leaders)
    wait_for(
        lambda: h.fenced.checkpoint.get(TOPIC) == dict.fromkeys(range(PARTITIONS), COUNT),
        "every lane's offsets in the checkpoint",
    )
    assert h.sink.offsets() == [(p, o) for p in range(PARTITIONS) for o in range(100, COUNT)]
    registry = h.registries[-1]
    for p in range(PARTITIONS):
        labels = {"pipeline": "events", "shard": "0", "partition": str(p)}
        assert registry.get_sample_value("hakafka_consumer_offset_resets_total", labels) == 1
        assert registry.get_sample_value("hakafka_consumer_skipped_offsets_total", labels) == 90


def test_lane_rates_follow_the_last_ten_seconds() -> None:
    rates = LaneRates()
    rates.sample(now=0.0)
    rates.stored(0, 1_000)
    rates.stored(1, 50)
    rates.sample(now=1.0)
    rates.stored(0, 1_000)
    # 2,000 rows in the 2 s since the first sample; a lane's lag is its partitions' (unknown
    # while one of them has none); the view lists lanes without rows too.
    lag = {0: 5, 2: 7, 1: 0, 3: 1}
    views = rates.views([[0, 2], [1, 3], [4]], lag, now=2.0)
    assert [(v.lane, v.partitions, v.rows, v.rows_per_s, v.lag) for v in views] == [
        (0, [0, 2], 2_000, 1_000.0, 12),
        (1, [1, 3], 50, 25.0, 1),
        (2, [4], 0, 0.0, None),
    ]
    # A lane held (no sample, no rows) falls toward 0: the rate runs from the last sample
    # a window old (t = 1) to now.
    later = rates.views([[0, 2], [1, 3]], lag, now=41.0)
    assert [v.rows_per_s for v in later] == [1_000 / 40, 0.0]
    # Reading on at 100 rows/s for lane 0: samples older than the window are dropped but
    # one, so the rate is over the last 10 s only and the samples stay bounded.
    for t in range(50, 80):
        rates.stored(0, 100)
        rates.sample(now=float(t))
    assert [v.rows_per_s for v in rates.views([[0], [1]], lag, now=79.0)] == [100.0, 0.0]
    assert len(rates._samples) <= 12


def test_a_lane_that_raises_fails_the_term_and_the_next_delivers_the_rest_once(
    tmp_path: Path, leaders: list[PipelineLeader], monkeypatch: pytest.MonkeyPatch
) -> None:
    config = pipeline_config()
    h = Harness(tmp_path, config, filled_topic(PARTITIONS, COUNT))
    h.lanes = lane_parts(config, LaneTopic(PARTITIONS, COUNT), 2)
    # Each lane process raises at its fifth batch (a decoder bug); the variable is read
    # when a lane process starts.
    monkeypatch.setenv("HAKAFKA_RAISE_AT", "lane.decode:5")
    first = start(h, leaders)
    wait_for(lambda: first.status.state is PipelineState.FAILED, "the term to fail", 60.0)
    assert (first.status.error or "").startswith("InjectedFaultError: HAKAFKA_RAISE_AT planned")
    assert first.status.restartable
    monkeypatch.delenv("HAKAFKA_RAISE_AT")
    first.stop(5.0)
    h.fenced = h.fenced.next_term()
    second = start(h, leaders)  # replays what the first put in the WAL, reads on from there
    wait_for(
        lambda: h.fenced.checkpoint.get(TOPIC) == dict.fromkeys(range(PARTITIONS), COUNT),
        "every offset after the failure",
        60.0,
    )
    wait_for(lambda: second.buffer.rows.row_count == 0, "the buffer to empty")
    assert h.sink.offsets() == every_offset()


def test_what_a_lane_fails_with_reaches_the_pipeline_thread_as_it_was() -> None:
    # A bad message under on_error = "fail" must fail the term for good (not restartable)
    # with or without lanes: the DecodeError itself crosses the pipe.
    error = DecodeError("events", 3, 41, "not JSON")
    sent = sendable(error)
    assert sent is error
    back = pickle.loads(pickle.dumps(sent))
    assert isinstance(back, DecodeError) and str(back) == str(error)
    assert (back.partition, back.offset, back.reason) == (3, 41, "not JSON")

    class OddError(Exception):
        def __init__(self, a: int, b: int) -> None:
            super().__init__(f"{a}/{b}")

    named = sendable(OddError(1, 2))
    assert isinstance(named, LaneFailedError) and str(named) == "OddError: 1/2"


def test_status_shows_each_lanes_partitions_apart() -> None:
    lag = {0: 700, 1: 500, 2: 0, 3: 0}
    assert lag_by_lane(lag, [[0, 2], [1, 3]]) == "1200 (p0=700 p2=0 | p1=500 p3=0)"
    assert lag_by_lane(lag, [[0, 1, 2, 3]]) == "1200 (p0=700 p1=500 p2=0 p3=0)"
    assert lag_by_lane(None, []) is None
