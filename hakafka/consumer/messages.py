"""Kafka messages as columns: one pass of attribute reads, no per-row work after that."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Protocol

import numpy as np
import pyarrow as pa


class KafkaMessage(Protocol):
    """The part of `confluent_kafka.Message` the decoders read."""

    def topic(self) -> str | None: ...
    def partition(self) -> int | None: ...
    def offset(self) -> int | None: ...
    def timestamp(self) -> tuple[int, int]: ...
    def key(self) -> bytes | None: ...
    def value(self) -> bytes | None: ...


@dataclass(frozen=True)
class MessageColumns:
    """Column lists of a batch of data messages (same length, Kafka order: offsets increase
    within each partition). `timestamps` are epoch milliseconds as the broker gave them
    (-1: none). The Arrow forms of the meta columns are built once, on first use."""

    topics: list[str]
    partitions: list[int]
    offsets: list[int]
    timestamps: list[int]
    keys: list[bytes | None]
    values: list[bytes | None]

    def __len__(self) -> int:
        return len(self.offsets)

    @classmethod
    def from_messages(cls, messages: Sequence[KafkaMessage]) -> MessageColumns:
        """Extract the columns of data messages (error events must have been removed)."""
        return cls(
            topics=[m.topic() for m in messages],  # type: ignore[misc]
            partitions=[m.partition() for m in messages],  # type: ignore[misc]
            offsets=[m.offset() for m in messages],  # type: ignore[misc]
            timestamps=[m.timestamp()[1] for m in messages],
            keys=[m.key() for m in messages],
            values=[m.value() for m in messages],
        )

    @cached_property
    def single_topic(self) -> str | None:
        """The one topic of every message, or None if there are several (or none)."""
        if self.topics and self.topics.count(self.topics[0]) == len(self.topics):
            return self.topics[0]
        return None

    @cached_property
    def topic_array(self) -> pa.Array:
        topic = self.single_topic
        if topic is not None:
            return pa.repeat(pa.scalar(topic, pa.string()), len(self))
        return pa.array(self.topics, pa.string())

    @cached_property
    def partition_array(self) -> pa.Array:
        return int_array(self.partitions, np.int32)

    @cached_property
    def offset_array(self) -> pa.Array:
        return int_array(self.offsets, np.int64)

    @cached_property
    def timestamp_array(self) -> pa.Array:
        return kafka_timestamps(self.timestamps)

    @cached_property
    def key_array(self) -> pa.Array:
        return pa.array(self.keys, pa.binary())

    def ranges(self) -> dict[tuple[str, int], tuple[int, int]]:
        """First and last offset per (topic, partition) over all messages."""
        if not self.offsets:
            return {}
        topic = self.single_topic
        if topic is None:
            out: dict[tuple[str, int], tuple[int, int]] = {}
            for key, offset in zip(
                zip(self.topics, self.partitions, strict=True), self.offsets, strict=True
            ):
                seen = out.get(key)
                out[key] = (offset, offset) if seen is None else (seen[0], offset)
            return out
        parts = self.partition_array.to_numpy()
        offsets = self.offset_array.to_numpy()
        uniq, first, _ = self._partitions
        _, last_rev = np.unique(parts[::-1], return_index=True)
        last = len(parts) - 1 - last_rev
        return {
            (topic, int(p)): (int(offsets[f]), int(offsets[la]))
            for p, f, la in zip(uniq, first, last, strict=True)
        }

    def counts(self) -> dict[tuple[str, int], int]:
        """Messages per (topic, partition)."""
        topic = self.single_topic
        if topic is None:
            return dict(Counter(zip(self.topics, self.partitions, strict=True)))
        uniq, _, counts = self._partitions
        return {(topic, int(p)): int(n) for p, n in zip(uniq, counts, strict=True)}

    @cached_property
    def _partitions(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The partitions (sorted), the position of each one's first message, and how many
        messages each has: one pass shared by `ranges` and `counts`."""
        return np.unique(self.partition_array.to_numpy(), return_index=True, return_counts=True)


def int_array(values: list[int], dtype: type[np.signedinteger]) -> pa.Array:
    """A list of Python ints as an Arrow array without nulls (OverflowError if one does not
    fit `dtype`)."""
    # numpy converts ints of 2^30 and more (offsets, timestamps) ~8x faster than pa.array.
    return pa.array(np.fromiter(values, dtype, count=len(values)))


def kafka_timestamps(millis: list[int]) -> pa.Array:
    """Kafka timestamps as Arrow `timestamp[ms]`; a missing one (-1) becomes the epoch, which
    is also ClickHouse's default for DateTime64."""
    raw = np.maximum(np.fromiter(millis, np.int64, count=len(millis)), 0)
    return pa.array(raw.view("datetime64[ms]"))
