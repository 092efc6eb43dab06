"""The flush lane: seal a block, write the `pending` intent, flush it (retried with backoff,
never dropped), commit the checkpoint fenced by the epoch, drop the block from the buffer and
truncate the WAL.

The order is what makes a crash at any point safe: an intent without a checkpoint is
re-flushed by the next leader with the same block id (same deduplication tokens), and a
checkpoint is only written once ClickHouse acknowledged the block.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from buffer import Thresholds, should_flush
from hakafka.coordination import FencedError, PendingIntent
from hakafka.pipeline.buffer import PipelineBlock
from hakafka.pipeline.lane import Lane
from hakafka.pipeline.parts import Fenced, Flushed, Sink, Wal
from hakafka.pipeline.state import PipelineState, PipelineStopped
from spark_bridge.replicas import Replica

FLUSH_CHECK_S = 0.05
BACKOFF_INITIAL_S = 0.5
BACKOFF_MAX_S = 10.0


@dataclass
class FlushLane:
    """Flushes and commits the pipeline's blocks; runs on the flush thread (and on the
    pipeline thread for the pending re-flush of recovery)."""

    lane: Lane
    thresholds: Thresholds
    sink: Sink
    fenced: Fenced
    replicas: Callable[[], tuple[Replica, ...]]
    wal: Wal | None = None
    checkpoint: dict[int, int] = field(default_factory=dict)

    def run(self) -> None:
        """Seal and flush whenever the thresholds say so, until the pipeline stops. A flush
        that cannot go on (fenced, stopped) ends the loop; any other error fails the pipeline."""
        lane = self.lane
        signals = lane.signals
        try:
            while not signals.stop.is_set():
                signals.beat()
                time.sleep(FLUSH_CHECK_S)
                if not signals.gate.is_set() or not should_flush(
                    self.thresholds, lane.buffer.stats(), time.monotonic()
                ):
                    continue
                block = lane.buffer.seal()
                if block is not None:
                    self.flush_and_commit(block, intent_written=False)
        except (PipelineStopped, FencedError) as exc:
            lane.log.info("flush.stopped", reason=str(exc) or type(exc).__name__)
        except Exception as exc:
            lane.status.error = f"{type(exc).__name__}: {exc}"
            lane.log.error("flush.failed_permanently", error=lane.status.error)
            lane.status.enter(PipelineState.FAILED, lane.log, error=lane.status.error)
            signals.stop.set()
        finally:
            signals.beats_end()

    def flush_and_commit(self, block: PipelineBlock, *, intent_written: bool) -> None:
        """pending -> ClickHouse (retried until it lands) -> checkpoint -> drop -> truncate."""
        lane = self.lane
        signals = lane.signals
        signals.flush_idle.clear()
        try:
            began = time.monotonic()
            name, topic = lane.config.name, lane.config.topic
            parts = {p: rng for (t, p), rng in block.ranges.items() if t == topic}
            if not intent_written:
                intent = PendingIntent(
                    block.block_id,
                    {topic: {p: (r.first, r.last + 1) for p, r in parts.items()}},
                    self.fenced.epoch,
                )
                signals.wait_gate()
                self.fenced.write_pending(name, intent)
                lane.crash.hit("flush.after_pending")
            lane.status.pending_block = block.block_id
            flushed = self._flush_with_retry(block)
            lane.crash.hit("flush.after_insert")
            signals.wait_gate()
            if signals.abandoned.is_set():
                raise PipelineStopped("flush abandoned")
            committed = self.fenced.commit_checkpoint(
                name, {topic: {p: r.last + 1 for p, r in parts.items()}}
            )
            self.checkpoint = {int(p): int(o) for p, o in committed.get(topic, {}).items()}
            lane.crash.hit("flush.after_checkpoint")
            lane.buffer.commit(block)
            signals.committed.set()
            self._truncate_wal()
            took = time.monotonic() - began
            status = lane.status
            status.pending_block = None
            status.last_flush_at = time.time()
            status.last_flush_rows = block.row_count
            status.last_flush_seconds = took
            status.checkpoint = dict(self.checkpoint)
            lane.meters.flushed(flushed.rows, took)
            lane.meters.buffer(lane.buffer)
            lane.log.info(
                "flush.committed",
                block=block.block_id,
                rows=block.row_count,
                dead_letters=block.dead_count,
                seconds=round(took, 3),
                replica=flushed.replica,
                checkpoint={p: r.last + 1 for p, r in parts.items()},
            )
        finally:
            signals.flush_idle.set()

    def _flush_with_retry(self, block: PipelineBlock) -> Flushed:
        delay = BACKOFF_INITIAL_S
        attempt = 0
        lane = self.lane
        signals = lane.signals
        while True:
            attempt += 1
            signals.beat()
            signals.wait_gate()
            try:
                return self.sink.flush(block, self.replicas())
            except Exception as exc:
                lane.meters.flush_failed()
                lane.log.warning(
                    "flush.retry",
                    block=block.block_id,
                    attempt=attempt,
                    error=f"{type(exc).__name__}: {exc}"[:500],
                    backoff_s=delay,
                )
                if signals.stop.wait(delay):
                    raise PipelineStopped("stopped while retrying a flush") from None
                delay = min(delay * 2, BACKOFF_MAX_S)

    def _truncate_wal(self) -> None:
        wal = self.wal
        if wal is None:
            return
        point = self.lane.index.truncation_point(self.checkpoint)
        if point is not None:
            removed = wal.truncate_before(point)
            if removed:
                self.lane.log.info(
                    "wal.truncated", segments=[p.name for p in removed], before=str(point)
                )
