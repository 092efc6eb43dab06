"""Helpers for consumer tests against the session's tansu broker."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

import pytest
from confluent_kafka import Message, Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from hakafka.consumer import PartitionConsumer


def create_topic(bootstrap: str, name: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(name, partitions, 1)]).values():
        future.result(timeout=15)


def produce(bootstrap: str, topic: str, records: Iterable[tuple[int, bytes]]) -> None:
    """Produce (partition, value) records in order; keys are `k<n>`."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for n, (partition, value) in enumerate(records):
        producer.produce(topic, value=value, key=b"k%d" % n, partition=partition)
    assert producer.flush(15) == 0


def consume_until(
    consumer: PartitionConsumer,
    done: Callable[[list[Message]], bool],
    timeout: float = 20.0,
    quiet: float = 0.0,
) -> list[Message]:
    """Consume until `done(messages)` (then `quiet` more seconds) or `timeout` passes."""
    messages: list[Message] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not done(messages):
        messages += consumer.consume(1000, 0.2)
    settle = time.monotonic() + quiet
    while time.monotonic() < settle:
        messages += consumer.consume(1000, 0.2)
    return messages


@pytest.fixture
def new_topic(kafka, topic_prefix: str) -> Callable[[int], str]:
    """Create a topic with the given partition count, named after the test."""
    counter = iter(range(1000))

    def make(partitions: int) -> str:
        name = f"{topic_prefix}_{next(counter)}"
        create_topic(kafka.bootstrap, name, partitions)
        return name

    return make
