"""The tansu broker: 100k messages over 8 partitions read back with assign() from offsets."""

from __future__ import annotations

import time
from collections import defaultdict

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from devstack.kafka import KafkaBroker

pytestmark = pytest.mark.integration

PARTITIONS = 8
MESSAGES = 100_000


def _create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
        future.result(timeout=15)


def test_produce_and_assign_from_explicit_offsets(kafka: KafkaBroker, topic_prefix: str) -> None:
    topic = f"{topic_prefix}_events"
    _create_topic(kafka.bootstrap, topic, PARTITIONS)
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 20, "acks": "all"})
    for i in range(MESSAGES):
        while True:
            try:
                producer.produce(topic, value=b'{"n":%d}' % i, partition=i % PARTITIONS)
                break
            except BufferError:
                producer.poll(0.1)
    assert producer.flush(60) == 0

    per_partition = MESSAGES // PARTITIONS
    start = 100  # skip the first 100 of every partition to prove assign() honours offsets
    consumer = Consumer(
        {
            "bootstrap.servers": kafka.bootstrap,
            "group.id": f"{topic}_reader",
            "enable.auto.commit": False,
            "auto.offset.reset": "error",
        }
    )
    consumer.assign([TopicPartition(topic, p, start) for p in range(PARTITIONS)])
    offsets: dict[int, list[int]] = defaultdict(list)
    values: dict[int, list[bytes]] = defaultdict(list)
    expected = PARTITIONS * (per_partition - start)
    deadline = time.monotonic() + 60
    got = 0
    try:
        while got < expected and time.monotonic() < deadline:
            for msg in consumer.consume(10_000, 1.0):
                assert msg.error() is None, msg.error()
                partition, offset, value = msg.partition(), msg.offset(), msg.value()
                assert partition is not None and offset is not None and value is not None
                offsets[partition].append(offset)
                values[partition].append(value)
                got += 1
    finally:
        consumer.close()
    assert got == expected
    for p in range(PARTITIONS):
        assert offsets[p] == list(range(start, per_partition)), f"partition {p} not contiguous"
        # Message i went to partition i % 8 in order: offset o of p holds n = o * 8 + p.
        assert values[p][0] == b'{"n":%d}' % (start * PARTITIONS + p)
