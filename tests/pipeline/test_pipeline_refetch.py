"""KafkaRefetch with a stand-in consumer: ranges past retention and large, slow re-reads."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path

import pytest

from buffer import OffsetRange
from hakafka.consumer import OffsetOutOfRangeError
from hakafka.pipeline import PipelineLeader, PipelineState
from hakafka.pipeline.refetch import KafkaRefetch, RefetchConsumer, RefetchError
from tests.pipeline.fakes import (
    FakeConsumer,
    Harness,
    Topic,
    decoder_for,
    one_partition,
    pipeline_config,
    wait_for,
)
from tests.pipeline.test_pipeline_leader import insert_then_lose_the_term, leaders, start

__all__ = ["leaders"]  # the fixture, used by name


def refetch_over(consumer: FakeConsumer, stall_s: float) -> KafkaRefetch:
    def make(_refetch: KafkaRefetch, _partitions: list[int]) -> RefetchConsumer:
        return consumer

    return KafkaRefetch("127.0.0.1:1", "events", {}, stall_s=stall_s, make_consumer=make)


def test_range_wholly_past_retention_under_earliest_returns_what_is_left(tmp_path: Path) -> None:
    topic = Topic(partitions=1)
    topic.produce(0, 60)  # nothing arrives after the wanted range to end the read
    h = Harness(tmp_path, pipeline_config(), topic)
    # `earliest` moved the start to the log start, 60, past the wanted 10..50.
    consumer = FakeConsumer(topic, batch=10, log_starts={0: 60})
    refetch = refetch_over(consumer, stall_s=5.0)
    rows, dead = refetch({0: OffsetRange(10, 50)}, decoder_for(h.pipeline), lambda: None)
    assert rows.num_rows == 0 and dead is None


def test_a_slow_large_reread_goes_on_while_offsets_arrive(tmp_path: Path) -> None:
    topic, h = one_partition(tmp_path, 40)
    consumer = FakeConsumer(topic, batch=4, delay=0.2)
    steps: list[int] = []
    began = time.monotonic()
    refetch = refetch_over(consumer, stall_s=1.0)
    rows, _ = refetch({0: OffsetRange(0, 39)}, decoder_for(h.pipeline), lambda: steps.append(1))
    assert time.monotonic() - began > 1.0  # longer than the stall bound, but never stalled
    assert len(steps) >= 10  # the flush lane is told on every poll (it beats)
    assert rows.column("_offset").to_pylist() == list(range(40))


def test_a_reread_that_stalls_names_what_is_missing(tmp_path: Path) -> None:
    topic = Topic(partitions=1)
    topic.produce(0, 5)  # the wanted range goes to 9: offsets 5..9 never come
    h = Harness(tmp_path, pipeline_config(), topic)
    consumer = FakeConsumer(topic, batch=5, delay=0.01)
    refetch = refetch_over(consumer, stall_s=0.2)
    with pytest.raises(RefetchError, match=r"no wanted offset arrived for 0 s.*0: \(5, 9\)"):
        refetch({0: OffsetRange(0, 9)}, decoder_for(h.pipeline), lambda: None)


def test_pending_block_past_retention_under_fail_waits_for_ops(
    tmp_path: Path, leaders: list[PipelineLeader]
) -> None:
    _topic, h = one_partition(tmp_path, 30)
    insert_then_lose_the_term(h, leaders)

    def expired(_ranges: Mapping[int, OffsetRange], _decoder: object, _step: object) -> object:
        raise OffsetOutOfRangeError("events", 0, 0, 20, 30)

    h.refetch = expired  # type: ignore[assignment]
    h.wal_dir_name = "another-node-wal"
    second = start(h, leaders)
    wait_for(lambda: not second.running, "the pipeline to fail")
    assert second.status.state is PipelineState.FAILED
    assert second.status.restartable is False
    assert "out of range" in (second.status.error or "")
    assert h.fenced.pending is not None and h.fenced.commits == 0
