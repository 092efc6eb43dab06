"""One pipeline of one shard while this node leads the shard.

Recovery, then two threads:

- recovery (on becoming leader): read checkpoint and pending; re-flush the pending block
  first (rows from the local WAL when it has every offset, else re-read from Kafka); replay
  the WAL from the checkpoint into the buffer; assign the consumer after the last replayed
  offset.
- consume (`consume.ConsumeLane`, on the pipeline thread): consume -> decode -> WAL append
  (+ sync per policy) -> buffer append. At the buffer limit the batch is held and the
  partitions pause until a flush commits.
- flush (`flush.FlushLane`, on the flush thread): when the thresholds say so, seal a block,
  write the `pending` intent, flush it through the sink (retried with backoff, never
  dropped), commit the checkpoint (fenced by the epoch), drop the block from the buffer and
  truncate the WAL.

A pipeline is bound to one leadership term: every ZooKeeper read and write goes through
the `FencedState` of the term it was started for, so a node that lost that term gets
FencedError and stops, even if it has been elected again since. `suspend()` stops side
effects without losing state; `stop()` ends the pipeline, letting an in-flight flush
finish within a grace period.
"""

from __future__ import annotations

import threading
import time

import structlog

from buffer import Catalog, OffsetRange
from hakafka.config import PipelineConfig
from hakafka.consumer import DecodeError, Decoder
from hakafka.consumer.schema import dead_letter_arrow_schema
from hakafka.coordination import FencedError, PendingIntent
from hakafka.faults import CrashPlan
from hakafka.metrics import Metrics
from hakafka.pipeline.buffer import PipelineBuffer, make_block
from hakafka.pipeline.consume import ConsumeLane
from hakafka.pipeline.flush import FlushLane
from hakafka.pipeline.lane import Lane
from hakafka.pipeline.meters import PipelineMeters
from hakafka.pipeline.parts import PipelineParts, Wal
from hakafka.pipeline.replay import (
    ReplayCursor,
    WalIndex,
    checkpoint_offsets,
    covers,
    pending_rows,
    select_rows,
)
from hakafka.pipeline.state import PipelineState, PipelineStatus, PipelineStopped, Signals
from hakafka.pipeline.walcodec import decode, decode_header, ranges_of
from hakafka.settings import thresholds_of

log = structlog.get_logger("hakafka.pipeline")

JOIN_TIMEOUT_S = 10.0


class PipelineLeader:
    """Runs one pipeline for as long as this node leads its shard.

    Everything outside the process (Kafka, the WAL directory, ClickHouse through Spark,
    ZooKeeper) comes in through `parts`, so tests can drive it with in-memory fakes.
    """

    def __init__(
        self,
        *,
        config: PipelineConfig,
        shard: int,
        decoder: Decoder,
        parts: PipelineParts,
        catalog: Catalog,
        metrics: Metrics,
        crash: CrashPlan | None = None,
    ) -> None:
        self.config, self.shard, self.decoder = config, shard, decoder
        self._parts, self._catalog = parts, catalog
        self._crash = crash or CrashPlan(None)
        self.status = PipelineStatus()
        self.buffer = PipelineBuffer(
            config.name,
            decoder.schema.arrow_schema(),
            dead_letter_arrow_schema(),
            config.buffer.limit_bytes,
        )
        self._log = log.bind(pipeline=config.name, shard=shard)
        self._signals = Signals()
        self._meters = PipelineMeters(metrics, config.name, shard, config.on_error)
        self._index = WalIndex()
        lane = Lane(
            config=config,
            buffer=self.buffer,
            index=self._index,
            signals=self._signals,
            status=self.status,
            meters=self._meters,
            crash=self._crash,
            log=self._log,
        )
        self._consume = ConsumeLane(lane, decoder)
        self._flush = FlushLane(
            lane, thresholds_of(config), parts.sink, parts.fenced, parts.replicas
        )
        self._wal: Wal | None = None
        self._replay_next: dict[int, int] = {}
        self._registered: list[str] = []
        self._threads_done = 0
        self._done_lock = threading.Lock()
        self._main = threading.Thread(
            target=self._run, name=f"pipeline-{config.name}-{shard}", daemon=True
        )
        self._flusher = threading.Thread(
            target=self._flush_thread, name=f"flush-{config.name}-{shard}", daemon=True
        )

    # -- control -------------------------------------------------------------------------

    def start(self) -> None:
        self._register_tables()
        self._main.start()

    def _register_tables(self) -> None:
        """Make the buffer queryable as `<pipeline>` (and `<pipeline>_dead_letter`).

        A node normally serves one shard; if it leads two shards with the same pipeline,
        the second shard's tables get a `_shard<N>` suffix.
        """
        for table in (self.buffer.rows, self.buffer.dead):
            try:
                self._catalog.add(table)
            except ValueError:
                table.name = f"{table.name}_shard{self.shard}"
                self._catalog.add(table)
            self._registered.append(table.name)

    def suspend(self) -> None:
        """Stop side effects at once (ZooKeeper connection lost); state is kept."""
        self._signals.gate.clear()
        self._log.warning("pipeline.suspended")

    def resume(self) -> None:
        self._signals.gate.set()
        self._log.info("pipeline.resumed")

    def stop(self, grace: float) -> bool:
        """Stop consuming now; let a flush in flight finish for up to `grace` s, else abandon
        it (its checkpoint is never committed). True if nothing was abandoned."""
        signals = self._signals
        signals.stop.set()
        signals.gate.set()  # wake waiters; they see stop
        clean = signals.flush_idle.wait(grace)
        if not clean:
            signals.abandoned.set()
            self._log.warning("flush.abandoned", grace_s=grace)
        self._main.join(timeout=JOIN_TIMEOUT_S)
        if clean and self._flusher.ident is not None:  # never started if stopped in recovery
            self._flusher.join(timeout=JOIN_TIMEOUT_S)
        return clean

    @property
    def running(self) -> bool:
        return self._main.is_alive()

    def wait_consuming(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.status.state
            if state is PipelineState.CONSUMING or not state.live:
                return state is PipelineState.CONSUMING
            time.sleep(0.02)
        return False

    def stalled_for(self, now: float) -> float:
        """Seconds since the least recent step of a running pipeline thread (0: none runs)."""
        return self._signals.stalled_for(now)

    def lag(self) -> dict[int, int]:
        """Messages behind the fetched high watermark per partition (as of the last poll)."""
        return dict(self._consume.lag)

    def positions(self) -> dict[int, int]:
        """Next offset to consume per partition (as of the last poll)."""
        return dict(self._consume.positions)

    # -- pipeline thread: recovery then consumption ----------------------------------------

    def _run(self) -> None:
        self._signals.beat()
        try:
            wal = self._recover()
            self._flusher.start()
            self._replay(wal)
            self._consume.assign(
                self._parts.consumer(), {**self._flush.checkpoint, **self._replay_next}
            )
            self.status.enter(PipelineState.CONSUMING, self._log)
            self._consume.run(wal)
            self._set_stopped()
        except (PipelineStopped, FencedError) as exc:
            self._log.info("pipeline.stopped", reason=str(exc) or type(exc).__name__)
            self._set_stopped()
        except Exception as exc:
            status = self.status
            status.error = f"{type(exc).__name__}: {exc}"
            status.restartable = not isinstance(exc, DecodeError)
            status.enter(
                PipelineState.FAILED, self._log, error=status.error, restartable=status.restartable
            )
        finally:
            self._signals.beats_end()
            self._signals.stop.set()
            if self._flusher.ident is None:
                self._thread_done()  # the flusher never started: count it as done
            self._thread_done()

    def _flush_thread(self) -> None:
        try:
            self._flush.run()
        finally:
            self._thread_done()

    def _set_stopped(self) -> None:
        """`stopped`, unless the flush thread failed first (its error is the story)."""
        if self.status.state is not PipelineState.FAILED:
            self.status.enter(PipelineState.STOPPED, self._log)

    def _recover(self) -> Wal:
        """Open the WAL, make sure the tables exist, re-flush a pending block."""
        self.status.enter(PipelineState.RECOVERING, self._log)
        parts = self._parts
        self._wal = wal = parts.open_wal()
        self._flush.wal = wal
        report = wal.repair_report
        if not report.clean:
            self._log.error("wal.repaired", directory=str(wal.directory), report=repr(report))
        parts.sink.ensure_tables(parts.replicas())
        name = self.config.name
        self._flush.checkpoint = checkpoint_offsets(
            parts.fenced.read_checkpoint(name), self.config.topic
        )
        pending = parts.fenced.read_pending(name)
        self._log.info(
            "pipeline.recovering",
            checkpoint=self._flush.checkpoint,
            pending=None if pending is None else pending.block_id,
            epoch=parts.fenced.epoch,
        )
        if pending is not None:
            self._reflush(wal, pending)
        return wal

    def _reflush(self, wal: Wal, pending: PendingIntent) -> None:
        """Flush exactly the pending ranges again, with the same block id (same tokens): rows
        from the local WAL when it has every offset, else re-read from Kafka."""
        topic = self.config.topic
        wanted = {
            p: OffsetRange(first, end - 1)
            for p, (first, end) in pending.ranges.get(topic, {}).items()
            if end > first
        }
        held = [ranges_of(decode_header(r)) for r in wal.replay()]
        partition_ranges = [{p: rng for (t, p), rng in r.items() if t == topic} for r in held]
        if covers(partition_ranges, wanted):
            batches = (decode(record) for record in wal.replay())
            rows, dead = pending_rows(batches, topic, wanted, self.buffer.rows.schema)
            source = "wal"
        else:
            rows, dead = self._parts.refetch(wanted, self.decoder)
            source = "kafka"
            self.status.refetched_rows += rows.num_rows
        ranges = {(topic, p): rng for p, rng in wanted.items()}
        block = make_block(pending.block_id, ranges, rows, dead)
        self._log.info(
            "pending.reflush",
            block=pending.block_id,
            source=source,
            rows=block.row_count,
            dead=block.dead_count,
        )
        self._flush.flush_and_commit(block, intent_written=True)

    def _replay(self, wal: Wal) -> None:
        """Put WAL records at or past the checkpoint back into the buffer."""
        topic = self.config.topic
        cursor = ReplayCursor(dict(self._flush.checkpoint))
        replayed = 0
        for record in wal.replay():
            if self._signals.stop.is_set():
                raise PipelineStopped("stopped during replay")
            self._signals.beat()
            ranges = {
                p: rng for (t, p), rng in ranges_of(decode_header(record)).items() if t == topic
            }
            self._index.add(record.position, ranges)
            keep = cursor.accept(ranges)
            if not keep:
                continue
            batch = decode(record)
            rows = select_rows(batch.rows, keep)
            dead = select_rows(batch.dead_letters, keep) if batch.dead_letters is not None else None
            self._consume.append(rows, dead, {(topic, p): rng for p, rng in keep.items()})
            replayed += rows.num_rows
        self._replay_next = cursor.next_offsets
        self.status.replayed_rows = replayed
        self._log.info(
            "wal.replayed",
            rows=replayed,
            next_offsets=cursor.next_offsets,
            gaps=sorted(cursor.closed),
        )

    # -- teardown ------------------------------------------------------------------------

    def _thread_done(self) -> None:
        """Called as each of the two threads ends; the last one releases consumer and WAL."""
        with self._done_lock:
            self._threads_done += 1
            if self._threads_done < 2:
                return
        self._consume.close()
        wal, self._wal = self._wal, None
        self._flush.wal = None
        if wal is not None:
            wal.close()
        self._meters.buffer(None)
        for name in self._registered:
            self._catalog.remove(name)
        self._registered.clear()
        self._log.info("pipeline.released")
