"""A pipeline's checkpoint mirrored to a Kafka consumer group, for visibility only.

ZooKeeper's checkpoint is where a pipeline resumes; the group (`hakafka.<pipeline>` by
default) lets `kafka-consumer-groups`, Burrow or a Kafka UI show hakafka's progress and lag.
Commits are asynchronous and best effort: a failure is logged and never stops a flush, and
nothing reads the group back.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

import structlog
from confluent_kafka import Consumer, KafkaException, TopicPartition

from hakafka.consumer.partition_consumer import CLIENT_LOG, redact_settings

log = structlog.get_logger("hakafka.consumer.group_offsets")


class GroupOffsets:
    """Commits `topic`'s offsets to consumer group `group` through a client of its own (it
    joins no group and reads nothing), from one thread at a time."""

    def __init__(self, bootstrap: str, topic: str, group: str, settings: Mapping[str, str]) -> None:
        self.topic, self.group = topic, group
        config: dict[str, Any] = {
            **settings,
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "client.id": f"{group}-offsets",
            "enable.auto.commit": False,
            "on_commit": self._committed,
            "logger": CLIENT_LOG,
        }
        self._consumer = Consumer(config)
        self._settings = redact_settings(settings)

    def publish(self, offsets: Mapping[int, int]) -> None:
        """Commit `offsets` (partition -> next offset to read) to the group, asynchronously."""
        if not offsets:
            return
        try:
            self._consumer.commit(
                offsets=[TopicPartition(self.topic, p, o) for p, o in sorted(offsets.items())],
                asynchronous=True,
            )
            self._consumer.poll(0)  # serves the callbacks of earlier commits
        except KafkaException as exc:
            log.warning("kafka_group.commit_failed", group=self.group, error=str(exc))

    def _committed(self, error: Any, partitions: list[TopicPartition]) -> None:
        if error is not None:
            log.warning("kafka_group.commit_failed", group=self.group, error=str(error))

    def close(self) -> None:
        self._consumer.close()


class SharedGroupOffsets:
    """One `GroupOffsets` client for every term of a daemon that mirrors the same topic to
    the same group (the shards of one pipeline it leads): a client per term cost each led
    shard another librdkafka handle, four or five threads. `mirror()` hands a term its
    handle; the client is made for the first and closed with the last, and commits go
    through it one at a time."""

    def __init__(self, make: Callable[[], GroupOffsets]) -> None:
        self._make = make
        self._lock = threading.Lock()
        self._client: GroupOffsets | None = None
        self._users = 0

    def mirror(self) -> GroupOffsetsHandle:
        with self._lock:
            if self._client is None:
                self._client = self._make()
            self._users += 1
        return GroupOffsetsHandle(self)

    def publish(self, offsets: Mapping[int, int]) -> None:
        with self._lock:
            if self._client is not None:
                self._client.publish(offsets)

    def release(self) -> None:
        with self._lock:
            self._users -= 1
            if self._users == 0 and self._client is not None:
                self._client.close()
                self._client = None


class GroupOffsetsHandle:
    """One term's use of a `SharedGroupOffsets`: `close` (once; later calls do nothing)
    releases it."""

    def __init__(self, shared: SharedGroupOffsets) -> None:
        self._shared: SharedGroupOffsets | None = shared

    def publish(self, offsets: Mapping[int, int]) -> None:
        if self._shared is not None:
            self._shared.publish(offsets)

    def close(self) -> None:
        shared, self._shared = self._shared, None
        if shared is not None:
            shared.release()
