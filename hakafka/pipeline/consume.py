"""The consume lane's storing half: each read batch -> WAL append (+ sync per policy) ->
index -> buffer append, in the pipeline thread.

Batches come from a `BatchSource`: one `LaneReader` polled in this thread (`InlineSource`,
one lane), or several lanes reading in processes of their own (`lane_process.ProcessLanes`).
Either way the pipeline thread is the WAL's only writer and the buffer's only appender, so a
record's place in the WAL and in the buffer is the same for every lane.

At the buffer limit a batch is held and the lanes stop (backpressure) until a flush
commits; the WAL record is already written, so nothing is consumed twice.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Protocol

import pyarrow as pa

from buffer import BufferFull, OffsetRange
from hakafka.coordination.writers import PUSH_TOPIC
from hakafka.pipeline.buffer import Ranges
from hakafka.pipeline.context import PipelineContext
from hakafka.pipeline.lane_rates import LaneRates
from hakafka.pipeline.lane_reader import POLL_TIMEOUT_S, PUSH_POLL_S, LaneBatch, LaneReader
from hakafka.pipeline.parts import PushCopies, Wal
from hakafka.pipeline.push import (
    RECENT_SEQUENCES,
    PushDesk,
    PushOutOfOrderError,
    PushRefusedError,
    PushRequest,
    PushResult,
    settle,
)
from hakafka.pipeline.state import PipelineStopped, Waiting
from hakafka.pipeline.walcodec import WalBatch, decode, encode
from wal import FsyncPolicy, Record, RecordType


class BatchSource(Protocol):
    """Where the pipeline thread takes read batches from (one lane or several)."""

    def poll(self, timeout_s: float = POLL_TIMEOUT_S) -> list[LaneBatch]:
        """What the lanes read since the last call, waiting up to `timeout_s` for
        something; empty batches carry only positions and lag. Raises what a lane failed
        with."""
        ...

    def positions(self) -> dict[int, int]:
        """Next offset to read per partition, over every lane (as of their last poll)."""
        ...

    def lag(self) -> dict[int, int]:
        """Messages behind the high watermark per partition, over every lane."""
        ...

    def lanes(self) -> list[list[int]]:
        """The partitions each lane reads, by lane."""
        ...

    def pause(self) -> None:
        """Stop fetching (the buffer is full)."""
        ...

    def resume(self) -> None: ...

    def close(self) -> None: ...


@dataclass
class InlineSource:
    """One lane, its reader polled in the pipeline thread."""

    reader: LaneReader
    _last: LaneBatch = field(default_factory=lambda: LaneBatch({}, {}))

    def poll(self, timeout_s: float = POLL_TIMEOUT_S) -> list[LaneBatch]:
        self._last = self.reader.take(timeout_s)
        return [self._last]

    def positions(self) -> dict[int, int]:
        return self._last.positions

    def lag(self) -> dict[int, int]:
        return self._last.lag

    def lanes(self) -> list[list[int]]:
        return [sorted(self._last.positions)]

    def pause(self) -> None:
        if self.reader.consumer is not None:
            self.reader.consumer.pause()

    def resume(self) -> None:
        if self.reader.consumer is not None:
            self.reader.consumer.resume()

    def close(self) -> None:
        self.reader.close()


@dataclass
class ConsumeLane:
    """Stores read batches into the WAL and the buffer; runs on the pipeline thread."""

    context: PipelineContext
    source: BatchSource | None = None
    # Published by the pipeline thread, as the lanes last reported them.
    lag: dict[int, int] = field(default_factory=dict)
    positions: dict[int, int] = field(default_factory=dict)
    lanes: list[list[int]] = field(default_factory=list)
    rates: LaneRates = field(default_factory=LaneRates)
    push_rates: LaneRates = field(default_factory=LaneRates)  # pushed rows, under key 0
    desk: PushDesk | None = None  # where pushed batches wait for this thread
    copies: PushCopies | None = None  # where applied pushes are copied before their answer
    copying: int = 0  # batches whose copies have not come back (replication lag)
    _copying_lock: threading.Lock = field(default_factory=threading.Lock)
    pushed: dict[int, int] = field(default_factory=dict)  # writer partition -> next offset
    # Writer partition -> the sequences this term applied last, in order (see push.py).
    recent: dict[int, deque[int]] = field(default_factory=dict)

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

    def run(self, wal: Wal) -> None:
        """Store what the source reads until the pipeline stops."""
        source, context = self.source, self.context
        assert source is not None, "give the lane its source first"
        signals = context.signals
        while not signals.stop.is_set():
            signals.beat()
            if not signals.gate.wait(0.2):
                continue
            if signals.stop.is_set():
                break
            # With writers, in short slices: a push waits for the pipeline thread to apply it
            # (queryable) at most one slice, not a whole idle poll of Kafka.
            batches = source.poll(PUSH_POLL_S if self.pushed else POLL_TIMEOUT_S)
            self.positions, self.lag = source.positions(), source.lag()
            if (lanes := source.lanes()) != self.lanes:
                self.lanes = lanes
                context.meters.lanes(len(lanes))
            self.rates.sample()
            self.push_rates.sample()
            stored = False
            for batch in batches:
                if not batch.empty:
                    self.store(wal, batch)
                    stored = True
            if self.desk is not None:
                for request in self.desk.take():
                    self.push(wal, request, self.desk)
            if (
                not stored
                and Waiting.CHECKPOINT_OVERDUE in context.status.waits
                and self._nothing_owed()
            ):
                context.status.done_waiting(Waiting.CHECKPOINT_OVERDUE)

    def store(self, wal: Wal, batch: LaneBatch) -> None:
        """Append `batch`'s record to the WAL (synced per policy), index it and put its rows
        in the buffer (waiting there while it is full)."""
        context = self.context
        batch_sync = context.config.wal.fsync is FsyncPolicy.BATCH
        began = time.perf_counter()
        position = wal.append(batch.header, batch.payload)
        if batch_sync:
            wal.sync()
        context.crash.hit("consume.after_wal")
        if batch.decoded is not None:
            rows, dead = batch.decoded.rows, batch.decoded.dead_letters
        else:  # read by a lane process: the rows are the record's, zero-copy
            record = Record(position, RecordType.FULL, batch.header, memoryview(batch.payload))
            stored = decode(record)
            rows, dead = stored.rows, stored.dead_letters
        context.meters.consumed(
            rows=rows.num_rows,
            bad=batch.bad,
            dead_letters=0 if dead is None else dead.num_rows,
            message_bytes=batch.message_bytes,
            wal_bytes=len(batch.header) + len(memoryview(batch.payload)),
            wal_seconds=batch.encode_seconds + time.perf_counter() - began,
            synced=batch_sync,
            lane=batch.lane,
        )
        self.rates.stored(batch.lane, rows.num_rows)
        for gap in batch.gaps:
            # Kafka allows offsets without a message (transaction markers, aborted
            # transactions, compaction): they only count and, past one, are logged. A broker
            # that lost records shows here first.
            context.meters.offset_gap(gap.partition, gap.offsets)
            if gap.offsets > 1:
                context.log.info(
                    "consumer.offset_gap",
                    partition=gap.partition,
                    first=gap.first,
                    end=gap.end,
                    offsets=gap.offsets,
                )
        named = (context.config.topic, PUSH_TOPIC)
        context.index.add(position, {p: r for (t, p), r in batch.ranges.items() if t in named})
        self.append(rows, dead, batch.ranges)

    def push(self, wal: Wal, request: PushRequest, desk: PushDesk) -> None:
        """Apply a pushed batch once: WAL (synced), index, buffer; a retry of a batch applied
        before is not applied again. Either way `desk` answers it once a checkpoint covers
        it. Refused (429) when it would take the buffer past its limit; refused (409) when it
        is below the writer's position but was never applied (pushed out of order)."""
        context, partition = self.context, request.partition
        after = self.pushed.get(partition)
        if after is not None and request.first < after:
            recent = self.recent.get(partition, ())
            if recent and min(recent) < request.sequence and request.sequence not in recent:
                settle(request.done, _out_of_order(request.sequence, max(recent)))
                return
            desk.applied(request, PushResult(0, duplicate=True))
            return
        rows = request.rows
        if rows.num_rows == 0:
            settle(request.done, PushResult(0, duplicate=False))
            return
        buffer, size = context.buffer, request.nbytes
        if not request.recovered and buffer.nbytes + size > buffer.limit_bytes:
            settle(
                request.done,
                PushRefusedError(
                    f"{buffer.nbytes} bytes buffered of {buffer.limit_bytes}: "
                    f"{size} more would pass the limit",
                    status=429,
                    retry_after_s=1.0,
                ),
            )
            return
        # From where the writer's last batch ended, as a Kafka record starts at the
        # consumer's position: a writer's records are contiguous.
        span = OffsetRange(request.first if after is None else after, request.end - 1)
        ranges = {(PUSH_TOPIC, partition): span}
        try:
            header, payload = encode(WalBatch(context.config.name, ranges, rows))
            position = wal.append(header, payload)
            wal.sync()  # acknowledged data is on disk whatever the WAL's fsync policy
        except BaseException as exc:
            settle(request.done, exc)
            raise
        context.index.add(position, {partition: span})
        self.append(rows, None, ranges)
        self.pushed[partition] = request.end
        self.recent.setdefault(partition, deque(maxlen=RECENT_SEQUENCES)).append(request.sequence)
        context.meters.pushed(rows.num_rows)
        self.push_rates.stored(0, rows.num_rows)
        desk.applied(request, PushResult(rows.num_rows, duplicate=False))
        self._copy(request, desk)

    def _copy(self, request: PushRequest, desk: PushDesk) -> None:
        """Answer an applied push before its flush once it is as durable as `push_acks`
        asks: in the WAL alone (0), or copied to that many other nodes (a recovered batch
        is copied already; with too few nodes, or no copies part, the flush answers)."""
        acks = self.context.config.push_acks
        if acks == 0:
            desk.durable(request)
            return
        if self.copies is None or request.recovered:
            return
        copied = self.copies.replicate(
            request.partition,
            request.sequence,
            request.rows,
            acks,
            desk.committed_end(request.partition),
        )
        with self._copying_lock:
            self.copying += 1
        copied.add_done_callback(lambda done: self._copied(request, desk, done))

    def _copied(self, request: PushRequest, desk: PushDesk, done: Future[bool]) -> None:
        """A copy came back (on a sender thread): answer the push if it is durable now."""
        with self._copying_lock:
            self.copying -= 1
        ok = done.exception() is None and done.result()
        self.context.meters.push_copied(ok)
        if ok:
            desk.durable(request)

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
                        if self.source is not None:
                            self.source.pause()
                        if self.desk is not None:
                            # This thread takes no push until a flush commits: say so now.
                            self.desk.hold(f"{exc.nbytes} bytes buffered of {exc.limit_bytes}")
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
                if self.desk is not None:
                    self.desk.release()
                if self.source is not None:
                    self.source.resume()
                context.meters.backpressure(False)
                context.log.info("consumer.resumed")

    def _wait_commit(self, seen: int) -> None:
        """Return once a flush committed after `seen` commits, beating; PipelineStopped if
        the pipeline stops first."""
        signals = self.context.signals
        if not signals.waiter.until(lambda timeout: signals.wait_commit(seen, timeout)):
            raise PipelineStopped("stopped while the buffer was full") from None

    def close(self) -> None:
        source, self.source = self.source, None
        if source is not None:
            source.close()


def _out_of_order(sequence: int, latest: int) -> PushOutOfOrderError:
    return PushOutOfOrderError(
        f"sequence {sequence} of this writer is below where it is (sequence {latest} applied "
        "after it) and was never applied: the writer pushed batches at once or out of order "
        "(two pushers with one writer id?); nothing of it was applied"
    )
