"""Prometheus counters of the consumer, created on an injected registry (never the global).

Labels follow the daemon's one scheme: `pipeline`, `shard`, and `partition` where it applies.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter

from hakafka.consumer.partition_consumer import OffsetReset


@dataclass(frozen=True)
class ConsumerMetrics:
    """`offset_resets`/`skipped_offsets`/`offset_gaps` by pipeline, shard and partition;
    `bad_messages` by pipeline, shard and action (dead_letter, skip)."""

    offset_resets: Counter
    skipped_offsets: Counter
    offset_gaps: Counter
    bad_messages: Counter

    @classmethod
    def create(cls, registry: CollectorRegistry) -> ConsumerMetrics:
        return cls(
            offset_resets=Counter(
                "hakafka_consumer_offset_resets",
                "Out-of-range offsets reset to the log start (policy earliest)",
                ["pipeline", "shard", "partition"],
                registry=registry,
            ),
            skipped_offsets=Counter(
                "hakafka_consumer_skipped_offsets",
                "Offsets never read because retention removed them before consumption",
                ["pipeline", "shard", "partition"],
                registry=registry,
            ),
            offset_gaps=Counter(
                "hakafka_consumer_offset_gaps",
                "Offsets the broker passed over without a message (transaction markers and "
                "aborted transactions, compaction)",
                ["pipeline", "shard", "partition"],
                registry=registry,
            ),
            bad_messages=Counter(
                "hakafka_decode_bad_messages",
                "Messages that could not be decoded",
                ["pipeline", "shard", "action"],
                registry=registry,
            ),
        )

    def resets_of(self, pipeline: str, shard: int) -> Callable[[OffsetReset], None]:
        """The `PartitionConsumer(on_reset=)` callback that counts `pipeline`'s resets."""

        def count(reset: OffsetReset) -> None:
            labels = {"pipeline": pipeline, "shard": str(shard), "partition": str(reset.partition)}
            self.offset_resets.labels(**labels).inc()
            self.skipped_offsets.labels(**labels).inc(reset.skipped)

        return count

    def count_bad(self, pipeline: str, shard: int, action: str, bad: int) -> None:
        """`bad` messages of one batch were dead-lettered or skipped, per `action`."""
        if bad:
            labels = {"pipeline": pipeline, "shard": str(shard), "action": action}
            self.bad_messages.labels(**labels).inc(bad)
