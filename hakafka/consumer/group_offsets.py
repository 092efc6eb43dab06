"""A pipeline's checkpoint mirrored to a Kafka consumer group, for visibility only.

ZooKeeper's checkpoint is where a pipeline resumes; the group (`hakafka.<pipeline>` by
default) lets `kafka-consumer-groups`, Burrow or a Kafka UI show hakafka's progress and lag.
Commits are asynchronous and best effort: a failure is logged and never stops a flush, and
nothing reads the group back.
"""

from __future__ import annotations

from collections.abc import Mapping
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
