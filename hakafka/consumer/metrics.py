"""Prometheus counters of the consumer, created on an injected registry (never the global)."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter

from hakafka.consumer.decode import DecodedBatch
from hakafka.consumer.partition_consumer import OffsetReset


@dataclass(frozen=True)
class ConsumerMetrics:
    """`offset_resets`/`skipped_offsets` by topic and partition; `bad_messages` by pipeline
    and action (dead_letter, skip). Pass `on_offset_reset` to `PartitionConsumer(on_reset=)`."""

    offset_resets: Counter
    skipped_offsets: Counter
    bad_messages: Counter

    @classmethod
    def create(cls, registry: CollectorRegistry) -> ConsumerMetrics:
        return cls(
            offset_resets=Counter(
                "hakafka_consumer_offset_resets",
                "Out-of-range offsets reset to the log start (policy earliest)",
                ["topic", "partition"],
                registry=registry,
            ),
            skipped_offsets=Counter(
                "hakafka_consumer_skipped_offsets",
                "Offsets never read because retention removed them before consumption",
                ["topic", "partition"],
                registry=registry,
            ),
            bad_messages=Counter(
                "hakafka_decode_bad_messages",
                "Messages that could not be decoded",
                ["pipeline", "action"],
                registry=registry,
            ),
        )

    def on_offset_reset(self, reset: OffsetReset) -> None:
        labels = {"topic": reset.topic, "partition": str(reset.partition)}
        self.offset_resets.labels(**labels).inc()
        self.skipped_offsets.labels(**labels).inc(reset.skipped)

    def count_decoded(self, pipeline: str, action: str, batch: DecodedBatch) -> None:
        if batch.bad:
            self.bad_messages.labels(pipeline=pipeline, action=action).inc(batch.bad)
