"""PartitionConsumer and decoding against the real tansu broker."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable

import pytest
from confluent_kafka import KafkaException, Message
from prometheus_client import CollectorRegistry

from hakafka.consumer import (
    ConsumerMetrics,
    Format,
    OffsetOutOfRangeError,
    OutOfRange,
    PartitionConsumer,
    PipelineSchema,
    ShardAssignment,
    make_decoder,
)
from hakafka.consumer.partition_consumer import KafkaMetadataError
from tests.transactions import produce_transactions

from .conftest import consume_until, create_topic, produce

pytestmark = pytest.mark.integration


def coords(messages: list[Message]) -> list[tuple[int, int]]:
    return [(m.partition(), m.offset()) for m in messages]  # type: ignore[misc]


def test_shard_assignment_covers_every_partition_exactly_once(kafka, new_topic) -> None:
    topic = new_topic(7)
    produce(kafka.bootstrap, topic, [(p, b"v%d" % p) for p in range(7)])
    for shard_count in (1, 2, 3, 5):
        seen: Counter[tuple[int, int]] = Counter()
        for shard in range(shard_count):
            consumer = PartitionConsumer(
                kafka.bootstrap, topic, ShardAssignment(shard, shard_count)
            )
            try:
                assigned = consumer.assign({})
                assert assigned == [p for p in range(7) if p % shard_count == shard]
                want = len(assigned)
                got = consume_until(consumer, lambda m: len(m) >= want)  # noqa: B023
                seen.update(coords(got))
            finally:
                consumer.close()
        assert seen == Counter({(p, 0): 1 for p in range(7)}), shard_count


def test_explicit_shard_lists_are_honoured(kafka, new_topic) -> None:
    topic = new_topic(4)
    consumer = PartitionConsumer(kafka.bootstrap, topic, ShardAssignment(0, 2, explicit=(1, 2, 9)))
    try:
        assert consumer.assign({2: 0}) == [1, 2]
        with pytest.raises(RuntimeError, match="already assigned"):
            consumer.assign({})
    finally:
        consumer.close()


def test_consumption_from_explicit_offsets_returns_exactly_those(kafka, new_topic) -> None:
    topic = new_topic(3)
    produce(kafka.bootstrap, topic, [(p, b"%d-%d" % (p, i)) for i in range(50) for p in range(3)])
    consumer = PartitionConsumer(kafka.bootstrap, topic, [0, 1, 2])
    try:
        consumer.assign({0: 10, 1: 0, 2: 49})
        got = consume_until(consumer, lambda m: len(m) >= 81, quiet=0.5)
        by_partition: dict[int, list[int]] = {}
        for partition, offset in coords(got):
            by_partition.setdefault(partition, []).append(offset)
        assert by_partition == {0: list(range(10, 50)), 1: list(range(50)), 2: [49]}
        assert [m.value() for m in got if m.partition() == 2] == [b"2-49"]
        assert consumer.position() == {0: 50, 1: 50, 2: 50}
        assert consumer.high_watermarks() == {0: 50, 1: 50, 2: 50}
        assert consumer.lag() == {0: 0, 1: 0, 2: 0}
    finally:
        consumer.close()


def test_lag_reflects_unread_messages(kafka, new_topic) -> None:
    topic = new_topic(1)
    produce(kafka.bootstrap, topic, [(0, b"x")] * 30)
    consumer = PartitionConsumer(kafka.bootstrap, topic, [0])
    try:
        consumer.assign({0: 0})
        first = consume_until(consumer, lambda m: len(m) >= 30)
        assert len(first) == 30
        produce(kafka.bootstrap, topic, [(0, b"y")] * 20)
        consumer.pause()
        consume_until(consumer, lambda m: False, timeout=0.6)
        consumer.resume()
        more = consume_until(consumer, lambda m: len(m) >= 20)
        assert [m.offset() for m in more] == list(range(30, 50))
        assert consumer.lag() == {0: 0}
    finally:
        consumer.close()


def test_pause_and_resume_some_or_all_partitions(kafka, new_topic) -> None:
    topic = new_topic(2)
    consumer = PartitionConsumer(kafka.bootstrap, topic, [0, 1])
    try:
        consumer.assign({0: 0, 1: 0})
        consumer.pause([1])
        assert consumer.paused() == {1}
        produce(kafka.bootstrap, topic, [(i % 2, b"a%d" % i) for i in range(40)])
        got = consume_until(consumer, lambda m: len(m) >= 20, quiet=1.0)
        assert coords(got) == [(0, i) for i in range(20)]
        assert consumer.position() == {0: 20, 1: 0}

        consumer.resume([1])
        assert consumer.paused() == set()
        got = consume_until(consumer, lambda m: len(m) >= 20)
        assert coords(got) == [(1, i) for i in range(20)]

        consumer.pause()
        assert consumer.paused() == {0, 1}
        produce(kafka.bootstrap, topic, [(i % 2, b"b%d" % i) for i in range(10)])
        assert consume_until(consumer, lambda m: False, timeout=1.5) == []
        consumer.resume()
        got = consume_until(consumer, lambda m: len(m) >= 10)
        assert sorted(coords(got)) == [(p, o) for p in (0, 1) for o in range(20, 25)]
        with pytest.raises(ValueError, match=r"partitions \[7\] .* are not assigned"):
            consumer.pause([7])
    finally:
        consumer.close()


def test_new_partitions_are_picked_up_without_restart(kafka, topic_prefix) -> None:
    # tansu has no CreatePartitions (KIP-195), and deleting a topic under a live librdkafka
    # consumer crashes it, so the topic goes from 0 partitions to 4 while we consume.
    topic = f"{topic_prefix}_late"
    consumer = PartitionConsumer(kafka.bootstrap, topic, ShardAssignment(1, 2))
    try:
        assert consumer.assign({}) == []
        assert consumer.refresh_partitions() == []
        create_topic(kafka.bootstrap, topic, 4)
        produce(kafka.bootstrap, topic, [(i % 4, b"n%d" % i) for i in range(16)])
        assert consumer.refresh_partitions() == [1, 3]
        assert consumer.refresh_partitions() == []
        got = consume_until(consumer, lambda m: len(m) >= 8, quiet=0.5)
        assert sorted(coords(got)) == [(p, o) for p in (1, 3) for o in range(4)]
        assert consumer.assigned() == [1, 3]
    finally:
        consumer.close()


def test_known_start_offsets_wait_for_their_topic_and_are_used_when_it_appears(
    kafka, topic_prefix
) -> None:
    topic = f"{topic_prefix}_later"
    consumer = PartitionConsumer(kafka.bootstrap, topic, ShardAssignment(1, 2))
    try:
        # A topic with known offsets missing from metadata is a hiccup, not "no partitions".
        with pytest.raises(KafkaMetadataError, match=rf"topic {topic} is missing from metadata"):
            consumer.assign({1: 2, 3: 1})
        create_topic(kafka.bootstrap, topic, 4)
        produce(kafka.bootstrap, topic, [(i % 4, b"n%d" % i) for i in range(16)])
        assert consumer.assign({1: 2, 3: 1}) == [1, 3]
        got = consume_until(consumer, lambda m: len(m) >= 5, quiet=0.5)
        assert sorted(coords(got)) == [(1, 2), (1, 3), (3, 1), (3, 2), (3, 3)]
    finally:
        consumer.close()


def test_positions_pass_transaction_markers_and_aborted_records_are_never_read(
    kafka, new_topic
) -> None:
    topic = new_topic(1)
    committed = produce_transactions(
        kafka.bootstrap,
        topic,
        [
            ([(0, b"c%d" % i) for i in range(3)], True),
            ([(0, b"aborted")] * 2, False),
            ([(0, b"d%d" % i) for i in range(2)], True),
        ],
    )
    consumer = PartitionConsumer(kafka.bootstrap, topic, [0])
    try:
        consumer.assign({0: 0})
        got = consume_until(consumer, lambda m: len(m) >= 5, quiet=1.0)
        assert coords(got) == committed
        assert [m.value() for m in got] == [b"c0", b"c1", b"c2", b"d0", b"d1"]
        # The next offset to read is past the last commit's marker: the log's end.
        end = committed[-1][1] + 2
        assert consumer.position() == {0: end} == consumer.high_watermarks()
        assert consumer.lag() == {0: 0}
    finally:
        consumer.close()


def test_offset_beyond_the_log_fails_naming_partition_and_offsets(kafka, new_topic) -> None:
    topic = new_topic(2)
    produce(kafka.bootstrap, topic, [(1, b"x")] * 5)
    consumer = PartitionConsumer(kafka.bootstrap, topic, [0, 1], out_of_range=OutOfRange.FAIL)
    try:
        consumer.assign({0: 0, 1: 500})
        with pytest.raises(OffsetOutOfRangeError) as caught:
            consume_until(consumer, lambda m: False, timeout=10)
        error = caught.value
        assert (error.partition, error.offset, error.low, error.high) == (1, 500, 0, 5)
        assert f"offset 500 of {topic}[1] is out of range" in str(error)
    finally:
        consumer.close()


def test_offset_out_of_range_earliest_policy_resets_loudly_and_counts(
    kafka, new_topic, capsys
) -> None:
    topic = new_topic(1)
    produce(kafka.bootstrap, topic, [(0, b"m%d" % i) for i in range(5)])
    registry = CollectorRegistry()
    metrics = ConsumerMetrics.create(registry)
    consumer = PartitionConsumer(
        kafka.bootstrap,
        topic,
        [0],
        out_of_range=OutOfRange.EARLIEST,
        on_reset=metrics.resets_of("events", 0),
    )
    try:
        consumer.assign({0: 99})
        got = consume_until(consumer, lambda m: len(m) >= 5)
        assert [m.offset() for m in got] == [0, 1, 2, 3, 4]
        assert consumer.position() == {0: 5}, "the position followed the reset back to 0"
        labels = {"pipeline": "events", "shard": "0", "partition": "0"}
        assert registry.get_sample_value("hakafka_consumer_offset_resets_total", labels) == 1
        assert registry.get_sample_value("hakafka_consumer_skipped_offsets_total", labels) == 0
        assert "consumer.offset_out_of_range" in capsys.readouterr().out
    finally:
        consumer.close()


def test_settings_pass_through_and_secrets_are_redacted(kafka, new_topic) -> None:
    topic = new_topic(1)
    consumer = PartitionConsumer(
        kafka.bootstrap,
        topic,
        [0],
        settings={"sasl.password": "hunter2", "ssl.key.password": "k3y", "client.id": "mine"},
    )
    try:
        text = repr(consumer)
        assert "hunter2" not in text and "k3y" not in text
        assert "'sasl.password': '***'" in text and "'client.id': 'mine'" in text
    finally:
        consumer.close()
    with pytest.raises(KafkaException, match=r"security\.protocol"):
        PartitionConsumer(kafka.bootstrap, topic, [0], settings={"security.protocol": "bogus"})
    with pytest.raises(ValueError, match=r"enable\.auto\.commit"):
        PartitionConsumer(kafka.bootstrap, topic, [0], settings={"enable.auto.commit": "true"})


def test_good_and_bad_json_from_the_broker_decode_with_exact_dead_letters(
    kafka, new_topic: Callable[[int], str]
) -> None:
    topic = new_topic(2)
    bad_at = {
        (0, 3): b'{"id": "three"}',
        (0, 7): b"\xff{}",
        (1, 0): b'{"name": "no id"}',
        (1, 9): b'{"id": 1,',
    }
    records = []
    for offset in range(10):
        for partition in (0, 1):
            value = bad_at.get((partition, offset))
            if value is None:
                value = json.dumps({"id": partition * 100 + offset, "name": "ok"}).encode()
            records.append((partition, value))
    produce(kafka.bootstrap, topic, records)
    schema = PipelineSchema.of([("id", "Int64"), ("name", "Nullable(String)")], ["_key"])
    consumer = PartitionConsumer(kafka.bootstrap, topic, [0, 1])
    try:
        consumer.assign({})
        messages = consume_until(consumer, lambda m: len(m) >= 20)
    finally:
        consumer.close()
    decoded = make_decoder(Format.JSON, schema).decode(messages)
    rows = list(
        zip(
            decoded.rows["_partition"].to_pylist(),
            decoded.rows["_offset"].to_pylist(),
            decoded.rows["id"].to_pylist(),
            strict=True,
        )
    )
    for partition in (0, 1):
        expected = [
            (partition, o, partition * 100 + o) for o in range(10) if (partition, o) not in bad_at
        ]
        assert [r for r in rows if r[0] == partition] == expected
    assert decoded.dead_letters is not None
    dead = decoded.dead_letters.to_pylist()
    assert sorted((d["_partition"], d["_offset"]) for d in dead) == sorted(bad_at)
    for d in dead:
        assert d["_value"] == bad_at[(d["_partition"], d["_offset"])]
        assert d["_topic"] == topic and d["_error"]
    assert decoded.ranges == {(topic, 0): (0, 9), (topic, 1): (0, 9)}
    assert (decoded.good, decoded.bad) == (16, 4)
