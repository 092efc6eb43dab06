"""A topic's offsets as the broker has them, for ops commands: its partitions, their low and
high watermarks, and the first offset at or after a time. A short-lived client that joins no
group and commits nothing."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType

from confluent_kafka import Consumer, KafkaException, TopicPartition

from hakafka.consumer.errors import KafkaConsumeError
from hakafka.consumer.partition_consumer import CLIENT_LOG


@dataclass(frozen=True)
class Watermarks:
    """The offsets a partition holds: `low` (first kept) to `high` (next to be written)."""

    low: int
    high: int


class TopicOffsets:
    """Reads `topic`'s offsets through a client built from the pipeline's `settings` (SASL, TLS:
    the daemon's passthrough librdkafka settings). Every call is bounded by `timeout_s`."""

    def __init__(
        self, bootstrap: str, topic: str, settings: Mapping[str, str], timeout_s: float = 10.0
    ) -> None:
        self.topic = topic
        self._timeout = timeout_s
        self._consumer = Consumer(
            {
                **settings,
                "bootstrap.servers": bootstrap,
                "group.id": "hakafka-ops",  # required by the API; never joined or committed
                "enable.auto.commit": False,
                "logger": CLIENT_LOG,
            }
        )

    def __enter__(self) -> TopicOffsets:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        self._consumer.close()

    def partitions(self) -> list[int]:
        """The topic's partitions; KafkaConsumeError when the topic does not exist."""
        try:
            metadata = self._consumer.list_topics(self.topic, timeout=self._timeout)
        except KafkaException as exc:
            raise KafkaConsumeError(f"topic {self.topic}: metadata unavailable ({exc})") from None
        found = metadata.topics.get(self.topic)
        if found is None or found.error is not None or not found.partitions:
            why = "no such topic" if found is None or found.error is None else str(found.error)
            raise KafkaConsumeError(f"topic {self.topic}: {why}")
        return sorted(found.partitions)

    def watermarks(self, partitions: Sequence[int]) -> dict[int, Watermarks]:
        """Low and high watermark of each of `partitions`.

        The high watermark is confirmed by a fetch (what a consumer sees), not taken from the
        ListOffsets answer alone: a broker may answer ListOffsets(latest) with a stale offset
        (tansu, the dev stack's broker, answers the last batch's first offset + 1), and
        `--to-latest` would then land inside the last batch."""
        listed = {}
        for partition in partitions:
            try:
                listed[partition] = self._consumer.get_watermark_offsets(
                    TopicPartition(self.topic, partition), timeout=self._timeout
                )
            except KafkaException as exc:
                raise KafkaConsumeError(
                    f"{self.topic}[{partition}]: watermarks unavailable ({exc})"
                ) from None
        fetched = self._fetched_highs({p: low for p, (low, high) in listed.items() if high > low})
        return {p: Watermarks(low, fetched.get(p, high)) for p, (low, high) in listed.items()}

    def _fetched_highs(self, starts: Mapping[int, int]) -> dict[int, int]:
        """The high watermark a fetch from `starts` (partition -> offset) reports."""
        if not starts:
            return {}
        self._consumer.assign([TopicPartition(self.topic, p, o) for p, o in starts.items()])
        found: dict[int, int] = {}
        deadline = time.monotonic() + self._timeout
        try:
            while len(found) < len(starts):
                if time.monotonic() >= deadline:
                    missing = sorted(set(starts) - set(found))
                    raise KafkaConsumeError(
                        f"{self.topic}{missing}: no fetch answered within {self._timeout:.0f} s"
                    )
                self._consumer.consume(num_messages=1000, timeout=0.2)  # only the answer counts
                for partition in set(starts) - set(found):
                    _low, high = self._consumer.get_watermark_offsets(
                        TopicPartition(self.topic, partition), cached=True
                    )
                    if high >= 0:
                        found[partition] = high
        finally:
            self._consumer.unassign()
        return found

    def at_time(
        self,
        partitions: Sequence[int],
        timestamp_ms: int,
        marks: Mapping[int, Watermarks] | None = None,
    ) -> dict[int, int]:
        """The first offset of each partition whose message timestamp is at or after
        `timestamp_ms`; the high watermark where none is (everything is older). `marks`:
        the partitions' watermarks when the caller has just read them (else read here).

        The broker's answer (ListOffsets by time) is checked against the messages around it;
        where it does not hold (a broker without a time index: tansu answers 0), the offset
        is found by a binary search over fetched message timestamps, which assumes they do
        not decrease (LogAppendTime, or producers with steady clocks)."""
        asked = [TopicPartition(self.topic, p, timestamp_ms) for p in partitions]
        try:
            answered = self._consumer.offsets_for_times(asked, timeout=self._timeout)
        except KafkaException as exc:
            raise KafkaConsumeError(
                f"topic {self.topic}: offsets by time unavailable ({exc})"
            ) from None
        if marks is None:
            marks = self.watermarks(partitions)
        found = {}
        for tp in answered:
            if tp.error is not None:
                raise KafkaConsumeError(f"{self.topic}[{tp.partition}]: {tp.error}")
            mark = marks[tp.partition]
            offset = tp.offset if tp.offset >= 0 else mark.high
            if not self._first_at(tp.partition, offset, timestamp_ms, mark):
                offset = self._search(tp.partition, timestamp_ms, mark)
            found[tp.partition] = offset
        return found

    def newest_timestamps(self, marks: Mapping[int, Watermarks]) -> dict[int, int]:
        """The timestamp (ms) of the newest message of each partition of `marks` that holds
        one (partitions without a message are left out)."""
        found = {}
        for partition, mark in marks.items():
            if mark.high > mark.low:
                _at, timestamp = self._message_at(partition, mark.high - 1, mark)
                if timestamp != float("inf"):
                    found[partition] = int(timestamp)
        return found

    def _first_at(self, partition: int, offset: int, timestamp_ms: int, mark: Watermarks) -> bool:
        """True if `offset` is the first at or after `timestamp_ms`: the message before it is
        older, its own message is not."""
        if offset > mark.low and self._message_at(partition, offset - 1, mark)[1] >= timestamp_ms:
            return False
        return offset >= mark.high or self._message_at(partition, offset, mark)[1] >= timestamp_ms

    def _search(self, partition: int, timestamp_ms: int, mark: Watermarks) -> int:
        low, high = mark.low, mark.high
        for _ in range(64):  # log2 of any offset range
            if low >= high:
                return low
            middle = (low + high) // 2
            at, timestamp = self._message_at(partition, middle, mark)
            if timestamp >= timestamp_ms:
                high = middle
            else:
                low = at + 1
        return low

    def _message_at(self, partition: int, offset: int, mark: Watermarks) -> tuple[int, float]:
        """The offset and timestamp (ms) of the first message at or after `offset`; (high,
        inf) when there is none before the high watermark."""
        self._consumer.assign([TopicPartition(self.topic, partition, offset)])
        deadline = time.monotonic() + self._timeout
        try:
            while time.monotonic() < deadline:
                for message in self._consumer.consume(num_messages=100, timeout=0.2):
                    at = message.offset()
                    if message.error() is None and at is not None and at >= offset:
                        return at, float(message.timestamp()[1])
                _low, high = self._consumer.get_watermark_offsets(
                    TopicPartition(self.topic, partition), cached=True
                )
                position = self._consumer.position([TopicPartition(self.topic, partition)])[0]
                if high >= 0 and position.offset >= high:
                    break  # read to the end: no message at or after `offset`
            else:
                raise KafkaConsumeError(
                    f"{self.topic}[{partition}]: no fetch answered within {self._timeout:.0f} s"
                )
        finally:
            self._consumer.unassign()
        return mark.high, float("inf")
