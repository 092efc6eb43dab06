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
from tests.pipeline.fakes import (
    TOPIC,
    Harness,
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
    h.lanes = lane_parts(config, PARTITIONS, COUNT, lanes, late=1.0)
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
    # Ranks modulo the lane count: lane i reads partitions i, i + lanes, ...
    assert leader.lanes() == [list(range(i, PARTITIONS, lanes)) for i in range(lanes)]
    labels = {"pipeline": "events", "shard": "0"}
    assert h.registries[-1].get_sample_value("hakafka_pipeline_lanes", labels) == lanes
    assert leader.stop(5.0)
    assert h.registries[-1].get_sample_value("hakafka_pipeline_lanes", labels) == 0
    assert leader.status.state is PipelineState.STOPPED


def test_a_lane_that_raises_fails_the_term_and_the_next_delivers_the_rest_once(
    tmp_path: Path, leaders: list[PipelineLeader], monkeypatch: pytest.MonkeyPatch
) -> None:
    config = pipeline_config()
    h = Harness(tmp_path, config, filled_topic(PARTITIONS, COUNT))
    h.lanes = lane_parts(config, PARTITIONS, COUNT, 2)
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
