"""KafkaRefetch with a stand-in consumer: ranges past retention, large and slow re-reads,
ranges ending in offsets without messages; and against the broker, across transaction
markers."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from buffer import OffsetRange
from devstack.records import create_topic
from hakafka.consumer import OffsetOutOfRangeError
from hakafka.pipeline import PipelineLeader, PipelineState
from hakafka.pipeline.refetch import KafkaRefetch, RefetchConsumer, RefetchError
from tests.pipeline.fakes import (
    FakeConsumer,
    Harness,
    Topic,
    decoder_for,
    insert_then_lose_the_term,
    one_partition,
    pipeline_config,
    start,
    wait_for,
)
from tests.transactions import produce_transactions


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


def test_a_reread_ends_when_the_position_passes_a_range_ending_without_messages(
    tmp_path: Path,
) -> None:
    # A range in positions may end in offsets that hold no message (a transaction marker, a
    # compacted offset) and have one inside; nothing after it exists to end the read.
    topic = Topic(partitions=1)
    topic.produce(0, 5)
    topic.gap(0, 3)
    topic.produce(0, 5)
    topic.gap(0, 2)
    h = Harness(tmp_path, pipeline_config(), topic)
    refetch = refetch_over(FakeConsumer(topic, batch=4), stall_s=30.0)
    began = time.monotonic()
    rows, _ = refetch({0: OffsetRange(0, 14)}, decoder_for(h.pipeline), lambda: None)
    assert time.monotonic() - began < 5.0, "done when the position passed 14, not stalled"
    assert rows.column("_offset").to_pylist() == [0, 1, 2, 3, 4, 8, 9, 10, 11, 12]
    # A range that ends inside the gap: only the messages before it, none after.
    refetch = refetch_over(FakeConsumer(topic, batch=4), stall_s=30.0)
    rows, _ = refetch({0: OffsetRange(2, 6)}, decoder_for(h.pipeline), lambda: None)
    assert rows.column("_offset").to_pylist() == [2, 3, 4]


@pytest.mark.integration
def test_a_reread_from_the_broker_crosses_transaction_markers(
    kafka: Any, topic_prefix: str, tmp_path: Path
) -> None:
    name = f"{topic_prefix}_txn"
    create_topic(kafka.bootstrap, name, 1)

    def records(*amounts: int) -> list[tuple[int, bytes]]:
        return [(0, json.dumps({"user": "u0", "amount": a}).encode()) for a in amounts]

    committed = produce_transactions(
        kafka.bootstrap,
        name,
        [(records(0, 1, 2), True), (records(10, 11), False), (records(20, 21, 22, 23), True)],
    )
    offsets = [offset for _, offset in committed]
    assert offsets[-1] - offsets[0] + 1 > len(offsets), "a marker lies between the commits"
    # The range ends at the last commit's marker: no message there ends the read.
    last = offsets[-1] + 1
    refetch = KafkaRefetch(kafka.bootstrap, name, {}, stall_s=20.0)
    h = Harness(tmp_path, pipeline_config(), Topic(partitions=1))
    began = time.monotonic()
    rows, dead = refetch({0: OffsetRange(0, last)}, decoder_for(h.pipeline), lambda: None)
    assert time.monotonic() - began < 15.0, "not ended by the stall bound"
    assert rows.column("_offset").to_pylist() == offsets
    assert rows.column("amount").to_pylist() == [0, 1, 2, 20, 21, 22, 23], "nothing aborted"
    assert dead is None


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
