"""The flush lane: seal a block, write the `pending` intent, flush it (retried with backoff,
never dropped), commit the checkpoint fenced by the epoch, drop the block from the buffer and
truncate the WAL.

The order is what makes a crash at any point safe: an intent without a checkpoint is
re-flushed by the next leader along the tasks the intent recorded (same deduplication tokens,
checked to hold the same rows: see `blockplan`), and a checkpoint is only written once
ClickHouse acknowledged the block.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent import futures
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TypeVar

import pyarrow as pa

from buffer import OffsetRange, Thresholds, should_flush
from chlib.tables import SchemaMismatchError, UnsafeTableError
from hakafka.consumer import Decoder, OffsetOutOfRangeError
from hakafka.coordination import FencedError, PendingIntent
from hakafka.coordination.fenced import CheckpointRegressionError
from hakafka.coordination.writers import PUSH_TOPIC
from hakafka.pipeline.blockplan import (
    BlockMismatchError,
    PlannedBlock,
    block_settings,
    follow_plan,
    plan_block,
)
from hakafka.pipeline.buffer import PipelineBlock, make_block
from hakafka.pipeline.context import PipelineContext
from hakafka.pipeline.parts import OffsetsMirror, PipelineParts, Wal
from hakafka.pipeline.push import (
    Batch,
    PushDesk,
    PushedRowsMissingError,
    by_topic,
    kafka_only,
    pushed_batches,
    topic_of,
)
from hakafka.pipeline.replay import checkpoint_offsets
from hakafka.pipeline.state import Flush, PipelineStopped, Waiting
from retry_policy import Backoff, Waiter

FLUSH_CHECK_S = 0.05
BACKOFF_INITIAL_S = 0.5
BACKOFF_MAX_S = 10.0
# How often a re-flush waiting for recovery's WAL pass checks for a stop.
WAL_PASS_CHECK_S = 0.1

T = TypeVar("T")

# Not ClickHouse or Kafka being away: retrying cannot help.
NOT_RETRIED = (
    PipelineStopped,
    FencedError,
    OffsetOutOfRangeError,
    SchemaMismatchError,
    UnsafeTableError,
    PushedRowsMissingError,
)


@dataclass(frozen=True)
class PendingReflush:
    """The block a former leader left pending: flushed again before any new block."""

    intent: PendingIntent
    ranges: dict[int, OffsetRange]
    block: Future[PipelineBlock | None]
    """Its rows from the local WAL, set by recovery's WAL pass (which runs while the tables
    are made); None: the WAL lacks some, they are re-read from Kafka."""


@dataclass
class FlushLane:
    """Flushes and commits the pipeline's blocks, one at a time, on the flush thread.

    Its first job is the term's: make sure the tables exist, then re-flush the pending block
    (`pending`, set by recovery) with its old block id, so that the next block is sealed only
    after it committed. Meanwhile the consumer already runs; the buffer fills up to its
    limit, then backpressure holds it."""

    context: PipelineContext
    thresholds: Thresholds
    parts: PipelineParts
    decoder: Decoder
    rows_per_task: int
    """How many rows a new block's flush tasks hold (a re-flush follows its recorded plan)."""
    wal: Wal | None = None
    checkpoint: dict[int, int] = field(default_factory=dict)
    pending: PendingReflush | None = None
    drained: bool = False  # set once a draining pipeline committed everything it held
    mirror: OffsetsMirror | None = None  # this term's, built when the thread starts
    desk: PushDesk | None = None  # told of every commit: pushes are answered once flushed
    # Flushes, re-fetches and table creation wait out a failure with this policy (from the
    # constants above as they are when the lane is made).
    retry: Backoff = field(default_factory=lambda: Backoff(BACKOFF_INITIAL_S, BACKOFF_MAX_S))

    def run(self) -> None:
        """Seal and flush whenever the thresholds say so, until the pipeline stops. A flush
        that cannot go on (fenced, stopped) ends the loop; any other error fails the pipeline."""
        context = self.context
        signals = context.signals
        try:
            self.mirror = self.parts.mirror() if self.parts.mirror is not None else None
            self._retry(
                "tables", None, lambda: self.parts.sink.ensure_tables(self.parts.replicas())
            )
            if self.pending is not None:
                self._reflush(self.pending)
                self.pending = None
            while True:
                time.sleep(FLUSH_CHECK_S)
                # Never seal a block for a pipeline that is stopping.
                signals.check_stop("stopped")
                draining = signals.draining.is_set()
                if not signals.gate.is_set() or not (
                    draining
                    or should_flush(self.thresholds, context.buffer.stats(), time.monotonic())
                ):
                    continue
                # In flight before the seal takes the rows out of the buffer: the consume lane
                # must never see them in neither (it would take the shard for caught up).
                signals.begin_flush()
                try:
                    block = context.buffer.seal()
                    if block is not None:
                        planned = plan_block(block, self.rows_per_task)
                        self.flush_and_commit(planned, intent_written=False)
                finally:
                    signals.flush_idle.set()
                if block is None and draining:
                    self.drained = True
                    context.log.info("flush.drained", checkpoint=self.checkpoint)
                    return
        except (PipelineStopped, FencedError) as exc:
            context.log.info("flush.stopped", reason=str(exc) or type(exc).__name__)
        except Exception as exc:
            # These fail the same way on every leader: they wait for ops. A pending block past
            # retention under out_of_range = "fail" (kafka.out_of_range = "earliest" skips
            # it); a pending block that no longer matches its plan; a checkpoint commit that
            # would move backwards (a bug or a second writer: nothing was written).
            permanent = isinstance(
                exc,
                (
                    OffsetOutOfRangeError,
                    BlockMismatchError,
                    CheckpointRegressionError,
                    PushedRowsMissingError,
                ),
            )
            context.log.error("flush.failed_permanently", error=f"{type(exc).__name__}: {exc}")
            context.status.fail(exc, context.log, restartable=not permanent)
            signals.stop.set()
        finally:
            # A lane that ended makes no progress to wait for.
            context.status.done_waiting(Waiting.RETRYING_CLICKHOUSE)
            signals.beats_end()
            if self.mirror is not None:
                self.mirror.close()

    def _reflush(self, pending: PendingReflush) -> None:
        """Flush exactly the pending ranges again, with the same block id (same tokens)."""
        context = self.context
        context.status.reflushing, context.status.pending_block = True, pending.intent.block_id
        # In flight from here (a re-fetch can take a while): stop(grace) waits, then abandons.
        context.signals.begin_flush()
        try:
            if (local := self._wal_block(pending)) is not None:
                source, block = "wal", local
                if self.desk is not None:
                    self.desk.retried()  # retries taken aside meanwhile are not needed
            else:
                block, source = self._rebuilt(pending)
            context.log.info(
                "pending.reflush",
                block=block.block_id,
                source=source,
                rows=block.row_count,
                dead=block.dead_count,
            )
            planned = follow_plan(
                block, pending.intent, block_settings(context.config), self.rows_per_task
            )
            self.flush_and_commit(planned, intent_written=True)
        finally:
            context.status.reflushing = False
            context.signals.flush_idle.set()

    def _rebuilt(self, pending: PendingReflush) -> tuple[PipelineBlock, str]:
        """The pending block rebuilt without the local WAL, and from where: its Kafka ranges
        re-read, its pushed batches from their writers' retries."""
        context, topic = self.context, self.context.config.topic
        kafka, sources = kafka_only(pending.ranges), []
        rows: pa.Table | None = None
        dead: pa.Table | None = None
        if kafka:
            sources.append("kafka")
            rows, dead = self._retry(
                "refetch", None, lambda: self.parts.refetch(kafka, self.decoder, self._step)
            )
            context.status.refetched_rows += rows.num_rows
        if len(kafka) < len(pending.ranges):
            sources.append("retries")
            pushed = pa.Table.from_batches(self._retries(pending))
            rows = pushed if rows is None else pa.concat_tables([rows, pushed.cast(rows.schema)])
        assert rows is not None, "a pending block has ranges"
        block = make_block(
            pending.intent.block_id,
            {(topic_of(p, topic), p): r for p, r in pending.ranges.items()},
            rows,
            dead,
        )
        return block, "+".join(sources)

    def _retries(self, pending: PendingReflush) -> list[pa.RecordBatch]:
        """The pending block's pushed batches, as their writers push them again (they were
        never answered; recovery told the desk to take them aside: `PushDesk.await_retries`);
        waits, saying so, until all came."""
        context, intent = self.context, pending.intent
        if self.desk is None or not intent.pushed:
            writers = sorted(p for p in pending.ranges if p < 0)
            raise PushedRowsMissingError(
                f"block {intent.block_id} holds rows pushed by writer partitions {writers} "
                "that no WAL here has, and its intent does not list their batches: lead the "
                "shard from the node that flushed it (hakafka failover --to)"
            )
        desk, signals = self.desk, context.signals
        waiter = Waiter(signals.stop, signals.beat, WAL_PASS_CHECK_S)

        def all_retried(timeout: float) -> bool:
            if desk.all_retried.wait(timeout):
                return True
            context.status.wait(Waiting.PUSH_RETRIES, _awaited(intent.block_id, desk.awaited()))
            return False

        try:
            if not waiter.until(all_retried):
                raise PipelineStopped("stopped while awaiting pushes again")
        finally:
            context.status.done_waiting(Waiting.PUSH_RETRIES)
        return desk.retried()

    def _wal_block(self, pending: PendingReflush) -> PipelineBlock | None:
        """The pending block from the local WAL once recovery's pass has decided (None: from
        Kafka); PipelineStopped if the pipeline stops first."""
        signals = self.context.signals
        signals.check_stop("stopped while recovery read the WAL")
        waiter = Waiter(signals.stop, signals.beat, WAL_PASS_CHECK_S)
        if not waiter.until(lambda timeout: bool(futures.wait((pending.block,), timeout).done)):
            raise PipelineStopped("stopped while recovery read the WAL")
        return pending.block.result()

    def _step(self) -> None:
        """Called by a long re-fetch on every poll: beats, and ends it when stopping."""
        self.context.signals.beat()
        if self.context.signals.stop.is_set() and self.context.signals.abandoned.is_set():
            raise PipelineStopped("re-fetch abandoned")

    def flush_and_commit(self, planned: PlannedBlock, *, intent_written: bool) -> None:
        """pending -> ClickHouse (retried until it lands) -> checkpoint -> drop -> truncate."""
        context, block = self.context, planned.block
        signals = context.signals
        signals.check_stop("stopped before a flush")
        signals.begin_flush()
        try:
            began = time.monotonic()
            name, topic = context.config.name, context.config.topic
            named = (topic, PUSH_TOPIC)
            parts = {p: rng for (t, p), rng in block.ranges.items() if t in named}
            if not intent_written:
                self._check_not_below(block.block_id, parts)
                spans = {p: (r.first, r.last + 1) for p, r in parts.items()}
                intent = PendingIntent(
                    block.block_id,
                    by_topic(spans, topic),
                    self.parts.fenced.epoch,
                    planned.tasks,
                    block_settings(context.config),
                    pushed_batches(block.rows.table),
                )
                signals.wait_gate()
                self.parts.fenced.write_pending(name, intent)
                context.crash.hit("flush.after_pending")
            context.status.pending_block = block.block_id
            flushed = self._retry(
                "flush", block, lambda: self.parts.sink.flush(planned, self.parts.replicas())
            )
            context.crash.hit("flush.after_insert")
            signals.wait_gate()
            if signals.abandoned.is_set():
                raise PipelineStopped("flush abandoned")
            ends = {p: r.last + 1 for p, r in parts.items()}
            committed = self.parts.fenced.commit_checkpoint(name, by_topic(ends, topic))
            self.checkpoint = checkpoint_offsets(committed, topic)
            context.crash.hit("flush.after_checkpoint")
            if self.mirror is not None:
                self.mirror.publish(kafka_only(self.checkpoint))
            if self.desk is not None:
                self.desk.committed(self.checkpoint)
            context.buffer.commit(block)
            signals.note_commit()
            context.status.done_waiting(Waiting.CHECKPOINT_OVERDUE)
            self._truncate_wal()
            took = time.monotonic() - began
            status = context.status
            status.pending_block = None
            status.flushes.append(Flush(block.block_id, block.row_count, took, time.time()))
            status.checkpoint = dict(self.checkpoint)
            context.meters.flushed(flushed.rows, took)
            context.meters.buffer(context.buffer)
            context.log.info(
                "flush.committed",
                block=block.block_id,
                rows=block.row_count,
                dead_letters=block.dead_count,
                tasks=len(planned.rows),
                seconds=round(took, 3),
                replica=flushed.replica,
                checkpoint=ends,
            )
        finally:
            signals.flush_idle.set()

    def _check_not_below(self, block_id: str, parts: dict[int, OffsetRange]) -> None:
        """CheckpointRegressionError, before anything is written, if a new block starts below
        the checkpoint: the consumer was reset below it (under `kafka.out_of_range =
        "earliest"`, a topic recreated or truncated). Its offsets name other messages than
        the committed ones, and their tokens may be in ClickHouse already."""
        below = [
            f"partition {p} starts at {rng.first}, checkpoint {self.checkpoint[p]}"
            for p, rng in sorted(parts.items())
            if rng.first < self.checkpoint.get(p, rng.first)
        ]
        if below:
            raise CheckpointRegressionError(
                f"block {block_id} starts below the committed checkpoint ({'; '.join(below)}): "
                "the consumer was reset below it (topic recreated or truncated?); nothing "
                "written. Move the checkpoint by hand to where the topic now starts."
            )

    def _retry(self, what: str, block: PipelineBlock | None, call: Callable[[], T]) -> T:
        """`call()` until it succeeds, backing off per `retry` (0.5 s to 10 s), each attempt
        once the gate is open; PipelineStopped if the pipeline stops meanwhile. ClickHouse
        being away is waited out, never skipped; a `NOT_RETRIED` error propagates."""
        context, signals = self.context, self.context.signals

        def before() -> None:
            signals.beat()
            signals.wait_gate()

        def failed(exc: Exception, attempt: int, delay: float) -> None:
            error = f"{type(exc).__name__}: {exc}"[:500]
            # Shown by `status` while it lasts; the shard reports the pipeline stuck once it
            # lasts `stuck_after` (the retries go on).
            context.status.wait(Waiting.RETRYING_CLICKHOUSE, f"{what} failing: {error}")
            context.meters.flush_failed()
            context.log.warning(
                f"{what}.retry",
                block=None if block is None else block.block_id,
                attempt=attempt,
                error=error,
                backoff_s=delay,
            )

        result, attempts = self.retry.call(
            call,
            signals.waiter,
            retry_on=Exception,
            stopped=lambda: PipelineStopped(f"stopped while retrying ({what})"),
            give_up_on=NOT_RETRIED,
            before=before,
            on_retry=failed,
        )
        if context.status.done_waiting(Waiting.RETRYING_CLICKHOUSE) is not None:
            context.log.info(f"{what}.recovered", attempts=attempts)
        return result

    def _truncate_wal(self) -> None:
        wal = self.wal
        if wal is None:
            return
        point = self.context.index.truncation_point(self.checkpoint)
        if point is not None:
            removed = wal.truncate_before(point)
            if removed:
                self.context.log.info(
                    "wal.truncated", segments=[p.name for p in removed], before=str(point)
                )


def _awaited(block_id: str, batches: list[Batch]) -> str:
    """What a re-flush awaits from writers, in words."""
    shown = ", ".join(
        f"writer {-1 - p} sequence {seq} ({rows} rows)" for p, seq, rows in batches[:5]
    )
    more = f" and {len(batches) - 5} more" if len(batches) > 5 else ""
    return (
        f"block {block_id} holds pushed batches no WAL here has: {shown}{more}; "
        "they are flushed once their writers push them again"
    )
