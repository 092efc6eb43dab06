"""One consume lane's reading half: poll its partitions, decode, and shape a WAL record.

A `LaneReader` owns a consumer of some of the shard's partitions (all of them with one lane)
and a decoder. `take()` polls once and returns a `LaneBatch`: the encoded WAL record (header
and payload), its offset range per partition, and what the consumer reports. Storing it
(WAL append, index, buffer) is the pipeline's job (`consume.ConsumeLane`), in the pipeline
thread: with one lane the reader runs there too; with several each runs in a process of its
own (`lane_process`), because decoding holds the GIL.

A WAL record's range per partition is in consumer positions (next offset to read): from
where the previous record ended to the position after the batch, minus one. Consecutive
records of a partition are therefore contiguous even across offsets that hold no message
(transaction markers, compacted or trimmed offsets), and a checkpoint is the next offset to
read. Lanes own disjoint partitions, so each keeps that bookkeeping for its own.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import pyarrow as pa
from structlog.typing import FilteringBoundLogger

from buffer import OffsetRange
from hakafka.consumer import DecodedBatch, Decoder
from hakafka.consumer.partition_consumer import KafkaMetadataError
from hakafka.consumer.registry import RegistryUnavailableError
from hakafka.faults import CrashPlan
from hakafka.pipeline.buffer import Ranges
from hakafka.pipeline.parts import ConsumedMessage, Consumer
from hakafka.pipeline.state import PipelineStopped, Signals, Wait, Waiting
from hakafka.pipeline.walcodec import WalBatch, encode
from retry_policy import Backoff

CONSUME_BATCH = 10_000
POLL_TIMEOUT_S = 0.2
# A pipeline with push writers polls in these slices instead (see ConsumeLane.run).
PUSH_POLL_S = 0.02
REFRESH_PARTITIONS_S = 30.0
TOPIC_RECHECK_S = 5.0  # how often a pipeline waiting for its topic looks for it
# After a metadata error, or while a partition with a known start offset is missing from
# metadata: retry after 0.5 s, doubling up to the refresh interval.
METADATA_RETRY_S = 0.5
# While the schema registry cannot answer, the same batch is decoded again after 0.5 s,
# doubling up to 10 s (as flushes wait for ClickHouse).
REGISTRY_RETRY_S = 0.5
REGISTRY_RETRY_MAX_S = 10.0


class Waits(Protocol):
    """Where a reader reports what it waits for (`PipelineStatus`, or a lane process's pipe
    to it)."""

    def wait(self, kind: Waiting, detail: str) -> bool: ...

    def done_waiting(self, kind: Waiting) -> Wait | None: ...


@dataclass(frozen=True)
class Gap:
    """`offsets` offsets of `partition` from `first` to before `end` came without a message."""

    partition: int
    first: int
    end: int
    offsets: int


@dataclass(frozen=True)
class LaneBatch:
    """One poll's outcome. `header`/`payload` is the WAL record to append (empty when the
    poll brought nothing: then only `positions` and `lag` say anything); `decoded` is the
    batch as the decoder returned it, or None when it came from another process (the rows
    are then read back from `payload`)."""

    positions: dict[int, int]
    lag: dict[int, int]
    ranges: Ranges = field(default_factory=dict)
    header: bytes = b""
    payload: bytes | pa.Buffer = b""
    message_bytes: int = 0
    encode_seconds: float = 0.0
    bad: int = 0
    gaps: tuple[Gap, ...] = ()
    decoded: DecodedBatch | None = None
    lane: int = 0  # which of the pipeline's lanes read it

    @property
    def empty(self) -> bool:
        return not self.header


@dataclass
class LaneReader:
    """Polls, decodes and encodes for one lane; called from one thread only (librdkafka
    handles are not shared)."""

    pipeline: str
    topic: str
    decoder: Decoder
    signals: Signals
    waits: Waits
    log: FilteringBoundLogger
    crash: CrashPlan = field(default_factory=lambda: CrashPlan(None))
    consumer: Consumer | None = None
    # The retry policies, from the constants above as they are when the reader is made.
    metadata_retry: Backoff = field(
        default_factory=lambda: Backoff(METADATA_RETRY_S, REFRESH_PARTITIONS_S)
    )
    registry_retry: Backoff = field(
        default_factory=lambda: Backoff(REGISTRY_RETRY_S, REGISTRY_RETRY_MAX_S)
    )
    _starts: dict[int, int] = field(default_factory=dict)  # every start offset known at assign
    # Per partition, the next offset no WAL record covers yet (where the next record begins).
    _recorded: dict[int, int] = field(default_factory=dict)
    _refresh_failures: int = 0  # refreshes in a row that failed or left a known one missing
    _next_refresh: float = 0.0

    def assign(self, consumer: Consumer, starts: dict[int, int]) -> None:
        """Take `consumer` and assign its partitions, handing it every known start offset
        (partition -> next offset): a partition metadata does not show yet starts there when
        it appears; one without a known offset starts per the reset policy. A metadata error
        is retried with backoff (beating) until it clears or the pipeline stops."""
        self.consumer, self._starts = consumer, dict(starts)
        signals = self.signals

        def attempt() -> list[int]:
            assigned = consumer.assign(starts)
            self._metadata_answered(consumer)
            return assigned

        assigned, _ = self.metadata_retry.call(
            attempt,
            signals.waiter,
            retry_on=KafkaMetadataError,
            stopped=lambda: PipelineStopped("stopped while retrying Kafka metadata"),
            before=lambda: signals.check_stop("stopped before the consumer was assigned"),
            on_retry=lambda exc, attempts, delay: self._metadata_failed(
                "assign", exc, attempts, delay
            ),
        )
        self._recorded = consumer.position()
        self._next_refresh = time.monotonic()  # at once: a known partition may still be missing
        self.log.info(
            "consumer.assigned",
            partitions=assigned,
            start_offsets=self._recorded,
            waiting=sorted(set(starts) - set(assigned)),
        )

    def _metadata_failed(
        self, what: str, exc: KafkaMetadataError, attempt: int, delay: float
    ) -> None:
        """Report a metadata error (the pipeline waits for Kafka), retried after `delay`."""
        self.waits.wait(Waiting.KAFKA_UNREACHABLE, f"Kafka unreachable: {exc}"[:500])
        self.log.warning(
            "consumer.metadata_retry", what=what, error=str(exc), attempt=attempt, backoff_s=delay
        )

    def _metadata_answered(self, consumer: Consumer) -> bool:
        """Kafka answered metadata: end that wait; wait for the topic while it does not exist
        (a partition-less assignment of an existing topic is an idle shard, not a wait).
        True while the topic is missing."""
        waits, topic = self.waits, self.topic
        if waits.done_waiting(Waiting.KAFKA_UNREACHABLE) is not None:
            self.log.info("consumer.kafka_reachable")
        missing = not consumer.position() and not consumer.topic_partitions()
        if not missing:
            if waits.done_waiting(Waiting.TOPIC_MISSING) is not None:
                self.log.info("consumer.topic_found", topic=topic)
        elif waits.wait(Waiting.TOPIC_MISSING, f"topic {topic} does not exist"):
            self.log.error("consumer.topic_missing", topic=topic)
        return missing

    def _refresh(self, consumer: Consumer) -> float:
        """Assign partitions that appeared; returns seconds until the next refresh: the
        interval, or a backoff while metadata fails, the topic is missing or a known
        partition is still missing."""
        try:
            added = consumer.refresh_partitions()
            topic_missing = self._metadata_answered(consumer)
        except KafkaMetadataError as exc:
            self._refresh_failures += 1
            delay = self.metadata_retry.delay(self._refresh_failures)
            self._metadata_failed("refresh", exc, self._refresh_failures, delay)
            return delay
        if topic_missing:
            return TOPIC_RECHECK_S
        positions = consumer.position()
        for partition in added:
            self._recorded.setdefault(partition, positions[partition])
        if set(self._starts) - set(positions):
            self._refresh_failures += 1
            return self.metadata_retry.delay(self._refresh_failures)
        self._refresh_failures = 0
        return REFRESH_PARTITIONS_S

    def take(self, timeout_s: float = POLL_TIMEOUT_S) -> LaneBatch:
        """Poll once, waiting up to `timeout_s` (refreshing the partitions when due), and
        return what came: an encoded WAL record, or an empty batch with the consumer's
        positions and lag."""
        consumer = self.consumer
        assert consumer is not None, "assign first"
        if time.monotonic() >= self._next_refresh:
            self._next_refresh = time.monotonic() + self._refresh(consumer)
        messages = consumer.consume(CONSUME_BATCH, timeout_s)
        positions, lag = consumer.position(), consumer.lag()
        if not messages:
            return LaneBatch(positions, lag)
        self.crash.hit("lane.decode")
        decoded = self._decode(messages)
        ranges, gaps = self._record_ranges(decoded, positions)
        began = time.perf_counter()
        header, payload = encode(
            WalBatch(self.pipeline, ranges, decoded.rows, decoded.dead_letters)
        )
        return LaneBatch(
            positions,
            lag,
            ranges,
            header,
            payload,
            message_bytes=sum(map(len, messages)),
            encode_seconds=time.perf_counter() - began,
            bad=decoded.bad,
            gaps=gaps,
            decoded=decoded,
        )

    def _record_ranges(
        self, decoded: DecodedBatch, positions: dict[int, int]
    ) -> tuple[Ranges, tuple[Gap, ...]]:
        """The WAL record's range per partition: from where the last record ended to the
        position after this batch, minus one (both in positions, so records are contiguous
        across offsets without messages), and the offsets in it that came without a message.
        A partition whose position only moved past such offsets rides along with no rows. A
        position reset (`out_of_range = earliest`) is covered by taking in the batch's own
        message offsets."""
        topic = self.topic
        ranges: Ranges = {}
        gaps: list[Gap] = []
        for partition, position in positions.items():
            first, end = self._recorded.get(partition, position), position
            got = decoded.ranges.get((topic, partition))
            if got is not None:
                first, end = min(first, got[0]), max(end, got[1] + 1)
                count = decoded.counts.get((topic, partition))
                if count is not None and got[1] + 1 - first > count:
                    gaps.append(Gap(partition, first, got[1] + 1, got[1] + 1 - first - count))
            if end > first:
                ranges[(topic, partition)] = OffsetRange(first, end - 1)
                self._recorded[partition] = end
        return ranges, tuple(gaps)

    def _decode(self, messages: Sequence[ConsumedMessage]) -> DecodedBatch:
        """Decode `messages`; while the schema registry cannot answer, wait and decode the
        same batch again (an outage, never a bad message), with the error in `waits`.
        PipelineStopped if the pipeline stops meanwhile."""

        def unavailable(exc: RegistryUnavailableError, attempt: int, delay: float) -> None:
            self.waits.wait(Waiting.REGISTRY_UNAVAILABLE, str(exc)[:500])
            self.log.warning(
                "decode.registry_retry", error=str(exc), attempt=attempt, backoff_s=delay
            )

        try:
            decoded, attempts = self.registry_retry.call(
                lambda: self.decoder.decode(messages),
                self.signals.waiter,
                retry_on=RegistryUnavailableError,
                stopped=lambda: PipelineStopped("stopped while waiting for the schema registry"),
                on_retry=unavailable,
            )
            if attempts > 1:
                self.log.info("decode.registry_recovered", attempts=attempts)
            return decoded
        finally:
            self.waits.done_waiting(Waiting.REGISTRY_UNAVAILABLE)

    def close(self) -> None:
        consumer, self.consumer = self.consumer, None
        if consumer is not None:
            consumer.close()
