"""The consume lane: consume -> decode -> WAL append (+ sync per policy) -> buffer append.

At the buffer limit a batch is held and the partitions pause until a flush commits
(backpressure); the WAL record is already written, so nothing is consumed twice.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import pyarrow as pa

from buffer import BufferFull, OffsetRange
from hakafka.consumer import Decoder
from hakafka.pipeline.buffer import Ranges
from hakafka.pipeline.lane import Lane
from hakafka.pipeline.parts import Consumer, Wal
from hakafka.pipeline.state import PipelineStopped
from hakafka.pipeline.walcodec import WalBatch, encode
from wal import FsyncPolicy

CONSUME_BATCH = 10_000
POLL_TIMEOUT_S = 0.2
REFRESH_PARTITIONS_S = 30.0


@dataclass
class ConsumeLane:
    """Moves consumed batches into the WAL and the buffer; runs on the pipeline thread."""

    lane: Lane
    decoder: Decoder
    consumer: Consumer | None = None
    # Published by the consume thread: the Kafka client must not be called from others.
    lag: dict[int, int] = field(default_factory=dict)
    positions: dict[int, int] = field(default_factory=dict)
    paused_since: float | None = None  # monotonic time the buffer limit paused the consumer

    def assign(self, consumer: Consumer, starts: dict[int, int]) -> None:
        """Take `consumer` and assign its owned partitions from `starts` (partition -> next
        offset; the reset policy decides for a partition not in it)."""
        self.consumer = consumer
        owned = set(consumer.owned_partitions())
        assigned = consumer.assign({p: o for p, o in starts.items() if p in owned})
        self.lane.log.info(
            "consumer.assigned",
            partitions=assigned,
            start_offsets={p: starts.get(p) for p in assigned},
        )

    def run(self, wal: Wal) -> None:
        """Consume until the pipeline stops."""
        consumer, lane = self.consumer, self.lane
        signals = lane.signals
        assert consumer is not None
        batch_sync = lane.config.wal.fsync is FsyncPolicy.BATCH
        topic = lane.config.topic
        next_refresh = time.monotonic() + REFRESH_PARTITIONS_S
        while not signals.stop.is_set():
            signals.beat()
            if not signals.gate.wait(0.2):
                continue
            if signals.stop.is_set():
                break
            messages = consumer.consume(CONSUME_BATCH, POLL_TIMEOUT_S)
            self.positions, self.lag = consumer.position(), consumer.lag()
            if time.monotonic() >= next_refresh:
                consumer.refresh_partitions()
                next_refresh = time.monotonic() + REFRESH_PARTITIONS_S
            if not messages:
                continue
            decoded = self.decoder.decode(messages)
            ranges = {
                (t, p): OffsetRange(first, last) for (t, p), (first, last) in decoded.ranges.items()
            }
            began = time.perf_counter()
            header, payload = encode(
                WalBatch(lane.config.name, ranges, decoded.rows, decoded.dead_letters)
            )
            position = wal.append(header, payload)
            if batch_sync:
                wal.sync()
            lane.crash.hit("consume.after_wal")
            lane.meters.consumed(
                decoded,
                sum(map(len, messages)),
                len(header) + len(memoryview(payload)),
                time.perf_counter() - began,
                batch_sync,
            )
            lane.index.add(position, {p: r for (t, p), r in ranges.items() if t == topic})
            self.append(decoded.rows, decoded.dead_letters, ranges)

    def append(self, rows: pa.RecordBatch, dead: pa.RecordBatch | None, ranges: Ranges) -> None:
        """Append to the buffer (the gauges follow); at its limit pause the partitions and
        wait for a commit. PipelineStopped if the pipeline stops meanwhile."""
        lane, paused = self.lane, False
        try:
            while True:
                seen = lane.signals.commits  # before the attempt: a commit after it counts
                try:
                    lane.buffer.append(rows, dead, ranges)
                    lane.meters.buffer(lane.buffer)
                    return
                except BufferFull as exc:
                    if not paused:
                        paused, self.paused_since = True, time.monotonic()
                        if self.consumer is not None:
                            self.consumer.pause()
                        lane.meters.backpressure(True)
                        lane.log.info(
                            "consumer.paused",
                            reason="buffer full",
                            buffered=exc.nbytes,
                            limit=exc.limit_bytes,
                        )
                    self._wait_commit(seen)
        finally:
            if paused:
                self.paused_since = None
                if self.consumer is not None:
                    self.consumer.resume()
                lane.meters.backpressure(False)
                lane.log.info("consumer.resumed")

    def _wait_commit(self, seen: int) -> None:
        signals = self.lane.signals
        while not signals.wait_commit(seen, 0.2):
            signals.beat()
            if signals.stop.is_set():
                raise PipelineStopped("stopped while the buffer was full") from None

    def close(self) -> None:
        consumer, self.consumer = self.consumer, None
        if consumer is not None:
            consumer.close()
