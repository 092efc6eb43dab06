"""Metadata hiccups: a partition missing from one answer, or an answer with an error, never
costs a known start offset (no reset to the low watermark, so no duplicates). The librdkafka
client is replaced by a stand-in whose metadata answers the test scripts."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from hakafka.consumer import PartitionConsumer, ShardAssignment
from hakafka.consumer import partition_consumer as module
from hakafka.consumer.partition_consumer import KafkaMetadataError
from hakafka.pipeline.state import PipelineStopped
from tests.pipeline.fakes import Harness, Topic, pipeline_config

TOPIC = "events"
LOW = 3  # every partition's log starts here


@dataclass
class PartitionMeta:
    error: KafkaError | None = None


@dataclass
class TopicMeta:
    partitions: dict[int, PartitionMeta]
    error: KafkaError | None = None


@dataclass
class Metadata:
    topics: dict[str, TopicMeta]


def answer(partitions: Iterable[int] = (), error: int | None = None, **broken: int) -> Metadata:
    """A metadata answer for TOPIC with `partitions` and error codes: `error` for the topic,
    `p<n>=code` for partition n (what librdkafka's list_topics returns, as far as read)."""
    parts = {
        p: PartitionMeta(None if (code := broken.get(f"p{p}")) is None else KafkaError(code))
        for p in partitions
    }
    return Metadata({TOPIC: TopicMeta(parts, None if error is None else KafkaError(error))})


class StandInClient:
    """librdkafka's Consumer as PartitionConsumer uses it: metadata answers are taken from
    `answers` in turn (an exception is raised), the last one repeating; assignments are
    recorded as (partition, offset) lists."""

    def __init__(self, answers: list[Any]) -> None:
        self.answers = answers
        self.asked = 0
        self.assigned: list[list[tuple[int, int]]] = []

    def list_topics(self, topic: str, timeout: float) -> Any:
        got = self.answers[min(self.asked, len(self.answers) - 1)]
        self.asked += 1
        if isinstance(got, Exception):
            raise got
        return got

    def get_watermark_offsets(
        self, tp: TopicPartition, timeout: float = 0, cached: bool = False
    ) -> tuple[int, int]:
        return (LOW, 100) if not cached else (-1, -1)

    def incremental_assign(self, tps: list[TopicPartition]) -> None:
        self.assigned.append([(tp.partition, tp.offset) for tp in tps])

    def position(self, tps: list[TopicPartition]) -> list[TopicPartition]:
        return [TopicPartition(tp.topic, tp.partition, -1001) for tp in tps]

    def consume(self, num_messages: int, timeout: float) -> list[Any]:
        return []

    def close(self) -> None:
        pass


@pytest.fixture
def client(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[StandInClient]]:
    """The stand-in clients PartitionConsumers get; a test sets `answers` on the first."""
    made: list[StandInClient] = []

    def make(_config: dict[str, Any]) -> StandInClient:
        made.append(StandInClient([answer([0, 1])]))
        return made[-1]

    monkeypatch.setattr(module, "Consumer", make)
    yield made


def consumer(client: list[StandInClient], *answers: Any) -> tuple[PartitionConsumer, Any]:
    made = PartitionConsumer("127.0.0.1:1", TOPIC, ShardAssignment(0, 1))
    client[-1].answers = list(answers)
    return made, client[-1]


def test_a_partition_missing_from_one_answer_starts_at_its_known_offset_later(
    client: list[StandInClient], tmp_path: Path
) -> None:
    # The first metadata answer lacks partition 1, the next ones have it.
    pc, kafka = consumer(client, answer([0]), answer([0, 1]))
    lane = Harness(tmp_path, pipeline_config(), Topic(partitions=2)).lane_reader()
    lane.assign(pc, {0: 5, 1: 7})
    assert kafka.assigned == [[(0, 5)]]
    assert pc.refresh_partitions() == [1]
    # Its checkpoint offset, never the low watermark (3): nothing is read twice.
    assert kafka.assigned == [[(0, 5)], [(1, 7)]]
    assert pc.position() == {0: 5, 1: 7}


def test_metadata_errors_are_retried_with_backoff_while_the_lane_beats(
    client: list[StandInClient], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pc, kafka = consumer(
        client,
        KafkaException(KafkaError(KafkaError._TRANSPORT)),
        answer([0, 1], error=KafkaError.LEADER_NOT_AVAILABLE),
        answer([0, 1], p1=KafkaError.LEADER_NOT_AVAILABLE),
        answer([0, 1]),
    )
    lane = Harness(tmp_path, pipeline_config(), Topic(partitions=2)).lane_reader()
    began = time.monotonic()
    lane.assign(pc, {0: 5, 1: 7})
    took = time.monotonic() - began
    assert kafka.assigned == [[(0, 5), (1, 7)]], "assigned once, when metadata was whole"
    assert 0.5 + 1 + 2 <= took < 10, took  # backoff 0.5 s, 1 s, 2 s
    assert lane.signals.stalled_for(time.monotonic()) < 1.0, "it kept beating"
    out = capsys.readouterr().out
    assert out.count("consumer.metadata_retry") == 3
    assert "metadata request failed" in out
    assert "metadata error Broker: Leader not available" in out
    assert "partition metadata errors {1: 'Broker: Leader not available'}" in out


def test_an_error_of_another_shards_partition_does_not_hold_this_one_up(
    client: list[StandInClient],
) -> None:
    two = PartitionConsumer("127.0.0.1:1", TOPIC, ShardAssignment(0, 2))
    client[-1].answers = [answer([0, 1, 2, 3], p1=KafkaError.LEADER_NOT_AVAILABLE)]
    assert two.assign({0: 5}) == [0, 2]
    assert client[-1].assigned == [[(0, 5), (2, LOW)]]
    client[-1].answers = [answer([0, 1, 2, 3], p2=KafkaError.LEADER_NOT_AVAILABLE)]
    with pytest.raises(KafkaMetadataError, match=r"partition metadata errors \{2: "):
        two.refresh_partitions()


def test_a_stop_ends_the_metadata_retries(client: list[StandInClient], tmp_path: Path) -> None:
    pc, _ = consumer(client, answer([0], error=KafkaError.LEADER_NOT_AVAILABLE))
    lane = Harness(tmp_path, pipeline_config(), Topic(partitions=1)).lane_reader()
    threading.Timer(1.0, lane.signals.stop.set).start()
    began = time.monotonic()
    with pytest.raises(PipelineStopped, match="Kafka metadata"):
        lane.assign(pc, {0: 5})
    assert time.monotonic() - began < 3.0


def test_a_missing_topic_is_no_partitions_only_without_known_offsets(
    client: list[StandInClient],
) -> None:
    absent = answer(error=KafkaError.UNKNOWN_TOPIC_OR_PART)
    fresh, _ = consumer(client, absent)
    assert fresh.assign({}) == []
    known, kafka = consumer(client, absent, answer([0, 1, 2]))
    with pytest.raises(
        KafkaMetadataError,
        match=r"topic events is missing from metadata, yet start offsets are known for "
        r"partitions \[0, 2\]",
    ):
        known.assign({0: 9, 2: 4})
    assert kafka.assigned == []
    assert known.assign({0: 9, 2: 4}) == [0, 1, 2]
    assert kafka.assigned == [[(0, 9), (1, LOW), (2, 4)]]


def test_a_failed_log_start_query_assigns_nothing(client: list[StandInClient]) -> None:
    pc, kafka = consumer(client, answer([0, 1]))
    calls = 0
    real = kafka.get_watermark_offsets

    def second_fails(tp: TopicPartition, timeout: float = 0, cached: bool = False) -> Any:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT))
        return real(tp, timeout, cached)

    kafka.get_watermark_offsets = second_fails
    with pytest.raises(KafkaMetadataError, match=r"events\[1\]: log start offset unavailable"):
        pc.assign({0: 5})
    assert kafka.assigned == [] and pc.position() == {}
    assert pc.assign({0: 5}) == [0, 1]
    assert kafka.assigned == [[(0, 5), (1, LOW)]]


def test_partitions_added_later_go_to_the_lane_their_rank_names(
    client: list[StandInClient],
) -> None:
    # Shard 0 of 1, two lanes: partitions 0 and 1 at first, then 2 and 3 appear.
    lanes = [ShardAssignment(0, 1).for_lane(i, 2) for i in range(2)]
    consumers = [PartitionConsumer("127.0.0.1:1", TOPIC, lane) for lane in lanes]
    for made in client:
        made.answers = [answer([0, 1]), answer([0, 1, 2, 3])]
    assert [c.assign({0: 5, 1: 7}) for c in consumers] == [[0], [1]]
    assert [c.refresh_partitions() for c in consumers] == [[2], [3]]
    # Each lane's first partition kept its known offset; the new ones start per policy.
    assert [made.assigned for made in client] == [[[(0, 5)], [(2, LOW)]], [[(1, 7)], [(3, LOW)]]]
