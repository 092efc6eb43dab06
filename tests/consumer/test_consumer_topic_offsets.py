"""`TopicOffsets` against the real broker: watermarks as a consumer sees them, and the first
offset at or after a time (what `hakafka offsets show|set` rely on)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from devstack.records import create_topic, produce
from hakafka.consumer import KafkaConsumeError
from hakafka.consumer.topic_offsets import TopicOffsets, Watermarks

pytestmark = pytest.mark.integration


def test_watermarks_and_offsets_by_time(kafka: Any, topic_prefix: str) -> None:
    topic = f"{topic_prefix}_offsets"
    create_topic(kafka.bootstrap, topic, 2)
    with TopicOffsets(kafka.bootstrap, topic, {}) as offsets:
        assert offsets.partitions() == [0, 1]
        assert offsets.watermarks([0, 1]) == {0: Watermarks(0, 0), 1: Watermarks(0, 0)}
    before = int(time.time() * 1000) - 1
    produce(kafka.bootstrap, topic, 1000, partitions=2)
    time.sleep(1.0)
    middle = int(time.time() * 1000)
    time.sleep(0.5)
    produce(kafka.bootstrap, topic, 1000, partitions=2, start=1000)
    with TopicOffsets(kafka.bootstrap, topic, {}) as offsets:
        # The broker's ListOffsets(latest) said 501 here (the last batch's first offset + 1).
        assert offsets.watermarks([0, 1]) == {0: Watermarks(0, 1000), 1: Watermarks(0, 1000)}
        assert offsets.at_time([0, 1], before) == {0: 0, 1: 0}
        # Its ListOffsets by time said 0 for these.
        assert offsets.at_time([0, 1], middle) == {0: 500, 1: 500}
        assert offsets.at_time([0, 1], int(time.time() * 1000) + 60_000) == {0: 1000, 1: 1000}


def test_a_missing_topic_is_named(kafka: Any, topic_prefix: str) -> None:
    with (
        TopicOffsets(kafka.bootstrap, f"{topic_prefix}_nope", {}, timeout_s=5) as offsets,
        pytest.raises(KafkaConsumeError, match=f"topic {topic_prefix}_nope: "),
    ):
        offsets.partitions()
