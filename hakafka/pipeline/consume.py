"""The consume lane: consume -> decode -> WAL append (+ sync per policy) -> buffer append.

At the buffer limit a batch is held and the partitions pause until a flush commits
(backpressure); the WAL record is already written, so nothing is consumed twice.

A WAL record's range per partition is in consumer positions (next offset to read): from
where the previous record ended to the position after the batch, minus one. Consecutive
records are therefore contiguous even across offsets that hold no message (transaction
markers, compacted or trimmed offsets), and a checkpoint is the next offset to read.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import pyarrow as pa

from buffer import BufferFull, OffsetRange
from hakafka.consumer import DecodedBatch, Decoder
from hakafka.consumer.partition_consumer import KafkaMetadataError
from hakafka.consumer.registry import RegistryUnavailableError
from hakafka.pipeline.buffer import Ranges
from hakafka.pipeline.context import PipelineContext
from hakafka.pipeline.parts import ConsumedMessage, Consumer, Wal
from hakafka.pipeline.state import PipelineStopped, Waiting
from hakafka.pipeline.walcodec import WalBatch, encode
from retry_policy import Backoff
from wal import FsyncPolicy

CONSUME_BATCH = 10_000
POLL_TIMEOUT_S = 0.2
REFRESH_PARTITIONS_S = 30.0
TOPIC_RECHECK_S = 5.0  # how often a pipeline waiting for its topic looks for it
# After a metadata error, or while a partition with a known start offset is missing from
# metadata: retry after 0.5 s, doubling up to the refresh interval.
METADATA_RETRY_S = 0.5
# While the schema registry cannot answer, the same batch is decoded again after 0.5 s,
# doubling up to 10 s (as flushes wait for ClickHouse).
REGISTRY_RETRY_S = 0.5
REGISTRY_RETRY_MAX_S = 10.0


@dataclass
class ConsumeLane:
    """Moves consumed batches into the WAL and the buffer; runs on the pipeline thread."""

    context: PipelineContext
    decoder: Decoder
    consumer: Consumer | None = None
    # The retry policies, from the constants above as they are when the lane is made.
    metadata_retry: Backoff = field(
        default_factory=lambda: Backoff(METADATA_RETRY_S, REFRESH_PARTITIONS_S)
    )
    registry_retry: Backoff = field(
        default_factory=lambda: Backoff(REGISTRY_RETRY_S, REGISTRY_RETRY_MAX_S)
    )
    # Published by the consume thread: the Kafka client must not be called from others.
    lag: dict[int, int] = field(default_factory=dict)
    positions: dict[int, int] = field(default_factory=dict)
    _starts: dict[int, int] = field(default_factory=dict)  # every start offset known at assign
    # Per partition, the next offset no WAL record covers yet (where the next record begins).
    _recorded: dict[int, int] = field(default_factory=dict)
    _refresh_failures: int = 0  # refreshes in a row that failed or left a known one missing

    def assign(self, consumer: Consumer, starts: dict[int, int]) -> None:
        """Take `consumer` and assign its partitions, handing it every known start offset
        (partition -> next offset): a partition metadata does not show yet starts there when
        it appears; one without a known offset starts per the reset policy. A metadata error
        is retried with backoff (beating) until it clears or the pipeline stops."""
        self.consumer, self._starts = consumer, dict(starts)
        signals = self.context.signals

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
        self.context.log.info(
            "consumer.assigned",
            partitions=assigned,
            start_offsets=self._recorded,
            waiting=sorted(set(starts) - set(assigned)),
        )

    def _metadata_failed(
        self, what: str, exc: KafkaMetadataError, attempt: int, delay: float
    ) -> None:
        """Report a metadata error (the pipeline waits for Kafka), retried after `delay`."""
        self.context.status.wait(Waiting.KAFKA_UNREACHABLE, f"Kafka unreachable: {exc}"[:500])
        self.context.log.warning(
            "consumer.metadata_retry", what=what, error=str(exc), attempt=attempt, backoff_s=delay
        )

    def _metadata_answered(self, consumer: Consumer) -> bool:
        """Kafka answered metadata: end that wait; wait for the topic while it does not exist
        (a partition-less assignment of an existing topic is an idle shard, not a wait).
        True while the topic is missing."""
        status, topic = self.context.status, self.context.config.topic
        if status.done_waiting(Waiting.KAFKA_UNREACHABLE) is not None:
            self.context.log.info("consumer.kafka_reachable")
        missing = not consumer.position() and not consumer.topic_partitions()
        if not missing:
            if status.done_waiting(Waiting.TOPIC_MISSING) is not None:
                self.context.log.info("consumer.topic_found", topic=topic)
        elif status.wait(Waiting.TOPIC_MISSING, f"topic {topic} does not exist"):
            self.context.log.error("consumer.topic_missing", topic=topic)
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

    def _nothing_owed(self) -> bool:
        """After an empty poll: True when the term has nothing waiting (no lag, an empty
        buffer, no block pending or in flight): a quiet topic, whose last checkpoint's age is
        no stall. A partition whose high watermark no fetch has brought yet has unknown lag,
        not none: a new leader's first polls come back empty before that."""
        status = self.context.status
        # The buffer first: the flush lane marks a block in flight before its seal empties
        # the buffer, so rows read as gone here are seen in flight below.
        return (
            self.context.buffer.stats().rows == 0
            and self.context.signals.flush_idle.is_set()
            and status.pending_block is None
            and self.lag.keys() >= self.positions.keys()
            and not any(self.lag.values())
        )

    def _record_ranges(self, decoded: DecodedBatch, positions: dict[int, int]) -> Ranges:
        """The WAL record's range per partition: from where the last record ended to the
        position after this batch, minus one (both in positions, so records are contiguous
        across offsets without messages). A partition whose position only moved past such
        offsets rides along with no rows. A position reset (`out_of_range = earliest`) is
        covered by taking in the batch's own message offsets."""
        topic = self.context.config.topic
        ranges: Ranges = {}
        for partition, position in positions.items():
            first, end = self._recorded.get(partition, position), position
            got = decoded.ranges.get((topic, partition))
            if got is not None:
                first, end = min(first, got[0]), max(end, got[1] + 1)
                count = decoded.counts.get((topic, partition))
                if count is not None and got[1] + 1 - first > count:
                    self._gap(partition, first, got[1] + 1, got[1] + 1 - first - count)
            if end > first:
                ranges[(topic, partition)] = OffsetRange(first, end - 1)
                self._recorded[partition] = end
        return ranges

    def _gap(self, partition: int, first: int, end: int, offsets: int) -> None:
        """`offsets` offsets of `partition` between `first` and `end` came without a message:
        Kafka allows it (transaction markers, aborted transactions, compaction), so they only
        count and, past one, are logged. A broker that lost records shows here first."""
        self.context.meters.offset_gap(partition, offsets)
        if offsets > 1:
            self.context.log.info(
                "consumer.offset_gap", partition=partition, first=first, end=end, offsets=offsets
            )

    def run(self, wal: Wal) -> None:
        """Consume until the pipeline stops."""
        consumer, context = self.consumer, self.context
        signals = context.signals
        assert consumer is not None
        batch_sync = context.config.wal.fsync is FsyncPolicy.BATCH
        topic = context.config.topic
        next_refresh = time.monotonic()  # at once: a known partition may still be missing
        while not signals.stop.is_set():
            signals.beat()
            if not signals.gate.wait(0.2):
                continue
            if signals.stop.is_set():
                break
            if time.monotonic() >= next_refresh:
                next_refresh = time.monotonic() + self._refresh(consumer)
            messages = consumer.consume(CONSUME_BATCH, POLL_TIMEOUT_S)
            self.positions, self.lag = consumer.position(), consumer.lag()
            if not messages:
                if Waiting.CHECKPOINT_OVERDUE in context.status.waits and self._nothing_owed():
                    context.status.done_waiting(Waiting.CHECKPOINT_OVERDUE)
                continue
            decoded = self._decode(messages)
            ranges = self._record_ranges(decoded, self.positions)
            began = time.perf_counter()
            header, payload = encode(
                WalBatch(context.config.name, ranges, decoded.rows, decoded.dead_letters)
            )
            position = wal.append(header, payload)
            if batch_sync:
                wal.sync()
            context.crash.hit("consume.after_wal")
            context.meters.consumed(
                decoded,
                sum(map(len, messages)),
                len(header) + len(memoryview(payload)),
                time.perf_counter() - began,
                batch_sync,
            )
            context.index.add(position, {p: r for (t, p), r in ranges.items() if t == topic})
            self.append(decoded.rows, decoded.dead_letters, ranges)

    def _decode(self, messages: Sequence[ConsumedMessage]) -> DecodedBatch:
        """Decode `messages`; while the schema registry cannot answer, wait and decode the
        same batch again (an outage, never a bad message), with the error in `status`.
        PipelineStopped if the pipeline stops meanwhile."""
        context = self.context

        def unavailable(exc: RegistryUnavailableError, attempt: int, delay: float) -> None:
            context.status.wait(Waiting.REGISTRY_UNAVAILABLE, str(exc)[:500])
            context.log.warning(
                "decode.registry_retry", error=str(exc), attempt=attempt, backoff_s=delay
            )

        try:
            decoded, attempts = self.registry_retry.call(
                lambda: self.decoder.decode(messages),
                context.signals.waiter,
                retry_on=RegistryUnavailableError,
                stopped=lambda: PipelineStopped("stopped while waiting for the schema registry"),
                on_retry=unavailable,
            )
            if attempts > 1:
                context.log.info("decode.registry_recovered", attempts=attempts)
            return decoded
        finally:
            context.status.done_waiting(Waiting.REGISTRY_UNAVAILABLE)

    def append(self, rows: pa.RecordBatch, dead: pa.RecordBatch | None, ranges: Ranges) -> None:
        """Append to the buffer (the gauges follow); at its limit pause the partitions and
        wait for a commit. PipelineStopped if the pipeline stops meanwhile."""
        context, paused = self.context, False
        try:
            while True:
                seen = context.signals.commits  # before the attempt: a commit after it counts
                try:
                    context.buffer.append(rows, dead, ranges)
                    context.meters.buffer(context.buffer)
                    return
                except BufferFull as exc:
                    if not paused:
                        paused = True
                        context.status.wait(
                            Waiting.BUFFER_FULL,
                            f"{exc.nbytes} bytes buffered of {exc.limit_bytes}, "
                            "consumption paused until a flush commits",
                        )
                        if self.consumer is not None:
                            self.consumer.pause()
                        context.meters.backpressure(True)
                        context.log.info(
                            "consumer.paused",
                            reason="buffer full",
                            buffered=exc.nbytes,
                            limit=exc.limit_bytes,
                        )
                    self._wait_commit(seen)
        finally:
            if paused:
                context.status.done_waiting(Waiting.BUFFER_FULL)
                if self.consumer is not None:
                    self.consumer.resume()
                context.meters.backpressure(False)
                context.log.info("consumer.resumed")

    def _wait_commit(self, seen: int) -> None:
        """Return once a flush committed after `seen` commits, beating; PipelineStopped if
        the pipeline stops first."""
        signals = self.context.signals
        if not signals.waiter.until(lambda timeout: signals.wait_commit(seen, timeout)):
            raise PipelineStopped("stopped while the buffer was full") from None

    def close(self) -> None:
        consumer, self.consumer = self.consumer, None
        if consumer is not None:
            consumer.close()
