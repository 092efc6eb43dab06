"""One pipeline of one shard while this node leads the shard.

Recovery, then two threads:

- recovery (on becoming leader): read checkpoint and pending; re-flush the pending block
  first (rows from the local WAL when it has every offset, else re-read from Kafka); replay
  the WAL from the checkpoint into the buffer; assign the consumer after the last replayed
  offset.
- consume: consume -> decode -> WAL append (+ sync per policy) -> buffer append. At the
  buffer limit the batch is held and the partitions pause until a flush commits.
- flush: when the thresholds say so, seal a block, write the `pending` intent, flush it
  through Spark (retried with backoff, never dropped), commit the checkpoint (fenced by the
  epoch), drop the block from the buffer and truncate the WAL.

A pipeline is bound to one leadership term: every ZooKeeper read and write goes through
the `FencedState` of the term it was started for, so a node that lost that term gets
FencedError and stops, even if it has been elected again since. `suspend()` stops side
effects without losing state; `stop()` ends the pipeline, letting an in-flight flush
finish within a grace period.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import structlog
from pyspark.sql import SparkSession

from buffer import BufferFull, Catalog, OffsetRange, Thresholds, should_flush
from hakafka.config import Config, PipelineConfig
from hakafka.consumer import (
    DecodedBatch,
    DecodeError,
    Decoder,
    PartitionConsumer,
    ShardAssignment,
)
from hakafka.consumer.schema import dead_letter_arrow_schema
from hakafka.coordination import FencedError, FencedState, PendingIntent
from hakafka.faults import CrashPlan
from hakafka.metrics import Metrics
from hakafka.pipeline_buffer import PipelineBlock, PipelineBuffer, make_block
from hakafka.refetch import refetch
from hakafka.replay import ReplayCursor, WalIndex, checkpoint_offsets, covers, select_rows
from hakafka.sink import PipelineSink
from hakafka.walcodec import WalBatch, decode, decode_header, encode, ranges_of
from spark_bridge import Replica
from wal import WriteAheadLog

log = structlog.get_logger("hakafka.pipeline")

CONSUME_BATCH = 10_000
POLL_TIMEOUT_S = 0.2
REFRESH_PARTITIONS_S = 30.0
BACKOFF_INITIAL_S = 0.5
BACKOFF_MAX_S = 10.0


class PipelineStopped(Exception):  # noqa: N818 - a control-flow signal, not an error
    """The pipeline was asked to stop while waiting."""


def thresholds_of(pipeline: PipelineConfig) -> Thresholds:
    b = pipeline.buffer
    return Thresholds(
        min_rows=b.min_rows,
        max_rows=b.max_rows,
        min_bytes=b.min_bytes,
        max_bytes=b.max_bytes,
        min_age_s=b.min_age,
        max_age_s=b.max_age,
    )


def wal_dir(config: Config, shard: int, pipeline: str) -> Path:
    return config.data_dir / "wal" / str(shard) / pipeline


@dataclass
class PipelineStatus:
    """What `status` shows of a running pipeline."""

    state: str = "starting"
    error: str | None = None
    last_flush_at: float | None = None
    last_flush_rows: int = 0
    last_flush_seconds: float = 0.0
    pending_block: str | None = None
    checkpoint: dict[int, int] = field(default_factory=dict)
    replayed_rows: int = 0
    refetched_rows: int = 0
    restarts: int = 0
    # False when a restart would fail the same way: a bad message with `on_error = "fail"`
    # waits for ops (as a failed Kafka Connect task does), it is not retried.
    restartable: bool = True


class PipelineLeader:
    """Runs one pipeline for as long as this node leads its shard."""

    def __init__(
        self,
        *,
        config: Config,
        pipeline: PipelineConfig,
        shard: int,
        decoder: Decoder,
        sink: PipelineSink,
        fenced: FencedState,
        spark: Callable[[], SparkSession],
        replicas: Callable[[], tuple[Replica, ...]],
        catalog: Catalog,
        metrics: Metrics,
        crash: CrashPlan | None = None,
    ) -> None:
        self.config = config
        self._crash = crash or CrashPlan(None)
        self.pipeline = pipeline
        self.shard = shard
        self.decoder = decoder
        self.sink = sink
        self.fenced = fenced
        self._spark = spark
        self._replicas = replicas
        self._catalog = catalog
        self._metrics = metrics
        self._labels = {"pipeline": pipeline.name, "shard": str(shard)}
        self.thresholds = thresholds_of(pipeline)
        self.status = PipelineStatus()
        schema = decoder.schema.arrow_schema()
        self.buffer = PipelineBuffer(
            pipeline.name, schema, dead_letter_arrow_schema(), pipeline.buffer.limit_bytes
        )
        self._index = WalIndex()
        self._index_lock = threading.Lock()
        self._wal: WriteAheadLog | None = None
        self._consumer: PartitionConsumer | None = None
        self._stop = threading.Event()
        self._gate = threading.Event()  # set while side effects are allowed (not suspended)
        self._gate.set()
        self._committed = threading.Event()  # a flush committed: held batches may go in
        self._flush_idle = threading.Event()  # no block in flight
        self._flush_idle.set()
        self._abandoned = threading.Event()
        self._checkpoint: dict[int, int] = {}
        self._replay_next: dict[int, int] = {}
        self._registered: list[str] = []
        # Published by the consume thread: the Kafka client must not be called from others.
        self._lag: dict[int, int] = {}
        self._positions: dict[int, int] = {}
        self._threads_done = 0
        # Thread id -> monotonic time of its last step; a running thread that stops stepping
        # (a hung disk, driver or call) makes the pipeline stuck.
        self._beats: dict[int, float] = {}
        self._done_lock = threading.Lock()
        self._main = threading.Thread(
            target=self._run, name=f"pipeline-{pipeline.name}-{shard}", daemon=True
        )
        self._flusher = threading.Thread(
            target=self._flush_loop, name=f"flush-{pipeline.name}-{shard}", daemon=True
        )
        self._log = log.bind(pipeline=pipeline.name, shard=shard)

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
        self._gate.clear()
        self._log.warning("pipeline.suspended")

    def resume(self) -> None:
        self._gate.set()
        self._log.info("pipeline.resumed")

    def stop(self, grace: float) -> bool:
        """Stop consuming now; let a flush in flight finish for up to `grace` s, else abandon
        it (its checkpoint is never committed). True if nothing was abandoned."""
        self._stop.set()
        self._gate.set()  # wake waiters; they see _stop
        clean = self._flush_idle.wait(grace)
        if not clean:
            self._abandoned.set()
            self._log.warning("flush.abandoned", grace_s=grace)
        self._main.join(timeout=10.0)
        if clean and self._flusher.ident is not None:  # never started if stopped in recovery
            self._flusher.join(timeout=10.0)
        return clean

    @property
    def running(self) -> bool:
        return self._main.is_alive()

    def wait_consuming(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.status.state in ("consuming", "failed", "stopped"):
                return self.status.state == "consuming"
            time.sleep(0.02)
        return False

    def stalled_for(self, now: float) -> float:
        """Seconds since the least recent step of a running pipeline thread (0: none runs)."""
        beats = list(self._beats.values())
        return max(0.0, now - min(beats)) if beats else 0.0

    def _beat(self) -> None:
        self._beats[threading.get_ident()] = time.monotonic()

    def _beats_end(self) -> None:
        self._beats.pop(threading.get_ident(), None)

    def lag(self) -> dict[int, int]:
        """Messages behind the fetched high watermark per partition (as of the last poll)."""
        return dict(self._lag)

    def positions(self) -> dict[int, int]:
        """Next offset to consume per partition (as of the last poll)."""
        return dict(self._positions)

    # -- main thread: recovery then consumption --------------------------------------------

    def _run(self) -> None:
        self._beat()
        try:
            self._recover()
            self._flusher.start()
            self._replay()
            self._start_consumer()
            self._set_state("consuming")
            self._consume_loop()
            self._set_stopped()
        except (PipelineStopped, FencedError) as exc:
            self._log.info("pipeline.stopped", reason=str(exc) or type(exc).__name__)
            self._set_stopped()
        except Exception as exc:
            self.status.error = f"{type(exc).__name__}: {exc}"
            self.status.restartable = not isinstance(exc, DecodeError)
            self._set_state("failed")
            self._log.error(
                "pipeline.failed", error=self.status.error, restartable=self.status.restartable
            )
        finally:
            self._beats_end()
            self._stop.set()
            if not self._flusher.is_alive() and self._flusher.ident is None:
                self._thread_done()  # the flusher never started: count it as done
            self._thread_done()

    def _set_state(self, state: str) -> None:
        self.status.state = state
        self._log.info(f"pipeline.{state}")

    def _set_stopped(self) -> None:
        """`stopped`, unless the flush thread failed first (its error is the story)."""
        if self.status.state != "failed":
            self._set_state("stopped")

    def _recover(self) -> None:
        self._set_state("recovering")
        directory = wal_dir(self.config, self.shard, self.pipeline.name)
        wal_cfg = self.pipeline.wal
        self._wal = WriteAheadLog.open(
            directory,
            fsync=wal_cfg.fsync,
            segment_bytes=wal_cfg.segment_bytes,
            interval_ms=wal_cfg.interval_ms,
        )
        report = self._wal.repair_report
        if not report.clean:
            self._log.error("wal.repaired", directory=str(directory), report=repr(report))
        self.sink.ensure_tables(self._replicas())
        fenced = self.fenced
        self._checkpoint = checkpoint_offsets(
            fenced.read_checkpoint(self.pipeline.name), self.pipeline.topic
        )
        pending = fenced.read_pending(self.pipeline.name)
        self._log.info(
            "pipeline.recovering",
            checkpoint=self._checkpoint,
            pending=None if pending is None else pending.block_id,
            epoch=fenced.epoch,
        )
        if pending is not None:
            self._reflush(pending)

    def _reflush(self, pending: PendingIntent) -> None:
        """Flush exactly the pending ranges again, with the same block id (same tokens)."""
        topic = self.pipeline.topic
        wanted = {
            p: OffsetRange(first, end - 1)
            for p, (first, end) in pending.ranges.get(topic, {}).items()
            if end > first
        }
        assert self._wal is not None
        records = [(r.position, ranges_of(decode_header(r))) for r in self._wal.replay()]
        partition_ranges = [
            {p: rng for (t, p), rng in ranges.items() if t == topic} for _, ranges in records
        ]
        if covers(partition_ranges, wanted):
            rows, dead = self._rows_from_wal(wanted)
            source = "wal"
        else:
            rows, dead = refetch(
                self.config.kafka.bootstrap,
                topic,
                wanted,
                self.decoder,
                settings=self.config.kafka.settings,
            )
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
        self._flush_and_commit(block, intent_written=True)

    def _rows_from_wal(self, wanted: dict[int, OffsetRange]) -> tuple[pa.Table, pa.Table | None]:
        assert self._wal is not None
        rows, dead = [], []
        for record in self._wal.replay():
            batch = decode(record)
            keep = {}
            for (t, p), rng in batch.ranges.items():
                need = wanted.get(p)
                if (
                    t == self.pipeline.topic
                    and need is not None
                    and rng.last >= need.first
                    and rng.first <= need.last
                ):
                    keep[p] = OffsetRange(max(rng.first, need.first), min(rng.last, need.last))
            if keep:
                rows.append(select_rows(batch.rows, keep))
                if batch.dead_letters is not None:
                    dead.append(select_rows(batch.dead_letters, keep))
        # Several WAL records may hold the same offsets (consumed again after a gap): keep one.
        table = _dedup_offsets(pa.Table.from_batches(rows, schema=self.buffer.rows.schema))
        dead_table = _dedup_offsets(pa.Table.from_batches(dead)) if dead else None
        return table, dead_table

    def _replay(self) -> None:
        """Put WAL records at or past the checkpoint back into the buffer."""
        assert self._wal is not None
        topic = self.pipeline.topic
        cursor = ReplayCursor(dict(self._checkpoint))
        replayed = 0
        for record in self._wal.replay():
            if self._stop.is_set():
                raise PipelineStopped("stopped during replay")
            self._beat()
            header = decode_header(record)
            all_ranges = ranges_of(header)
            ranges = {p: rng for (t, p), rng in all_ranges.items() if t == topic}
            with self._index_lock:
                self._index.add(record.position, ranges)
            keep = cursor.accept(ranges)
            if not keep:
                continue
            batch = decode(record)
            rows = select_rows(batch.rows, keep)
            dead = select_rows(batch.dead_letters, keep) if batch.dead_letters is not None else None
            self._append_blocking(rows, dead, {(topic, p): rng for p, rng in keep.items()})
            replayed += rows.num_rows
        self._replay_next = cursor.next_offsets
        self.status.replayed_rows = replayed
        self._log.info(
            "wal.replayed",
            rows=replayed,
            next_offsets=cursor.next_offsets,
            gaps=sorted(cursor.closed),
        )

    def _start_consumer(self) -> None:
        explicit = self.pipeline.partitions.get(self.shard) if self.pipeline.partitions else None
        spec = ShardAssignment(self.shard, self.config.shard_count, explicit)
        self._consumer = PartitionConsumer(
            self.config.kafka.bootstrap,
            self.pipeline.topic,
            spec,
            settings=self.config.kafka.settings,
            out_of_range=self.config.kafka.out_of_range,  # type: ignore[arg-type]
            group_id=f"hakafka-{self.config.node}",
            on_reset=self._metrics.consumer.on_offset_reset,
        )
        owned = set(self._consumer.owned_partitions())
        starts = {**self._checkpoint, **self._replay_next}
        assigned = self._consumer.assign({p: o for p, o in starts.items() if p in owned})
        self._log.info(
            "consumer.assigned",
            partitions=assigned,
            start_offsets={p: starts.get(p) for p in assigned},
        )

    def _consume_loop(self) -> None:
        consumer = self._consumer
        wal = self._wal
        assert consumer is not None and wal is not None
        batch_sync = self.pipeline.wal.fsync == "batch"
        topic = self.pipeline.topic
        next_refresh = time.monotonic() + REFRESH_PARTITIONS_S
        while not self._stop.is_set():
            self._beat()
            if not self._gate.wait(0.2):
                continue
            if self._stop.is_set():
                break
            messages = consumer.consume(CONSUME_BATCH, POLL_TIMEOUT_S)
            self._positions, self._lag = consumer.position(), consumer.lag()
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
                WalBatch(self.pipeline.name, ranges, decoded.rows, decoded.dead_letters)
            )
            position = wal.append(header, payload)
            if batch_sync:
                wal.sync()
            self._crash.hit("consume.after_wal")
            self._metrics.consumed_bytes.labels(**self._labels).inc(sum(map(len, messages)))
            self._account(
                decoded,
                len(header) + len(memoryview(payload)),
                time.perf_counter() - began,
                batch_sync,
            )
            with self._index_lock:
                self._index.add(position, {p: r for (t, p), r in ranges.items() if t == topic})
            self._append_blocking(decoded.rows, decoded.dead_letters, ranges)

    def _account(
        self, decoded: DecodedBatch, wal_bytes: int, wal_seconds: float, synced: bool
    ) -> None:
        m, labels = self._metrics, self._labels
        m.consumed_rows.labels(**labels).inc(decoded.rows.num_rows)
        m.wal_bytes.labels(**labels).inc(wal_bytes)
        m.wal_sync_seconds.labels(**labels).observe(wal_seconds)
        if synced:
            m.wal_syncs.labels(**labels).inc()
        if decoded.bad:
            m.consumer.count_decoded(self.pipeline.name, self.pipeline.on_error, decoded)
            if decoded.dead_letters is not None:
                m.dead_letters.labels(**labels).inc(decoded.dead_letters.num_rows)

    def _publish_buffer_gauges(self, released: bool = False) -> None:
        rows = 0 if released else self.buffer.rows.row_count
        self._metrics.buffer_rows.labels(**self._labels).set(rows)
        self._metrics.buffer_bytes.labels(**self._labels).set(0 if released else self.buffer.nbytes)

    def _append_blocking(
        self, rows: Any, dead: Any, ranges: dict[tuple[str, int], OffsetRange]
    ) -> None:
        """Append to the buffer (the gauges follow); at its limit pause the partitions and
        wait for a commit."""
        paused = False
        try:
            while True:
                try:
                    self.buffer.append(rows, dead, ranges)
                    self._publish_buffer_gauges()
                    return
                except BufferFull as exc:
                    if not paused:
                        paused = True
                        if self._consumer is not None:
                            self._consumer.pause()
                        self._metrics.backpressure.labels(**self._labels).set(1)
                        self._log.info(
                            "consumer.paused",
                            reason="buffer full",
                            buffered=exc.nbytes,
                            limit=exc.limit_bytes,
                        )
                    self._committed.clear()
                    while not self._committed.wait(0.2):
                        self._beat()
                        if self._stop.is_set():
                            raise PipelineStopped("stopped while the buffer was full") from None
        finally:
            if paused:
                if self._consumer is not None:
                    self._consumer.resume()
                self._metrics.backpressure.labels(**self._labels).set(0)
                self._log.info("consumer.resumed")

    # -- flush thread --------------------------------------------------------------------

    def _flush_loop(self) -> None:
        try:
            while not self._stop.is_set():
                self._beat()
                time.sleep(0.05)
                if not self._gate.is_set() or not should_flush(
                    self.thresholds, self.buffer.stats(), time.monotonic()
                ):
                    continue
                block = self.buffer.seal()
                if block is not None:
                    self._flush_and_commit(block, intent_written=False)
        except (PipelineStopped, FencedError) as exc:
            self._log.info("flush.stopped", reason=str(exc) or type(exc).__name__)
        except Exception as exc:
            self.status.error = f"{type(exc).__name__}: {exc}"
            self._log.error("flush.failed_permanently", error=self.status.error)
            self.status.state = "failed"
            self._stop.set()
        finally:
            self._beats_end()
            self._thread_done()

    def _flush_and_commit(self, block: PipelineBlock, *, intent_written: bool) -> None:
        """pending -> ClickHouse (retried until it lands) -> checkpoint -> drop -> truncate."""
        self._flush_idle.clear()
        try:
            began = time.monotonic()
            topic = self.pipeline.topic
            parts = {p: rng for (t, p), rng in block.ranges.items() if t == topic}
            fenced = self.fenced
            if not intent_written:
                intent = PendingIntent(
                    block.block_id,
                    {topic: {p: (r.first, r.last + 1) for p, r in parts.items()}},
                    fenced.epoch,
                )
                self._wait_gate()
                fenced.write_pending(self.pipeline.name, intent)
                self._crash.hit("flush.after_pending")
            self.status.pending_block = block.block_id
            result = self._flush_with_retry(block)
            self._crash.hit("flush.after_insert")
            self._wait_gate()
            if self._abandoned.is_set():
                raise PipelineStopped("flush abandoned")
            committed = fenced.commit_checkpoint(
                self.pipeline.name, {topic: {p: r.last + 1 for p, r in parts.items()}}
            )
            self._checkpoint = {int(p): int(o) for p, o in committed.get(topic, {}).items()}
            self._crash.hit("flush.after_checkpoint")
            self.buffer.commit(block)
            self._committed.set()
            self._truncate_wal()
            took = time.monotonic() - began
            self.status.pending_block = None
            self.status.last_flush_at = time.time()
            self.status.last_flush_rows = block.row_count
            self.status.last_flush_seconds = took
            self.status.checkpoint = dict(self._checkpoint)
            m = self._metrics
            m.flushes.labels(**self._labels, result="ok").inc()
            m.flush_rows.labels(**self._labels).inc(result.rows.rows)
            m.flush_seconds.labels(**self._labels).observe(took)
            self._publish_buffer_gauges()
            self._log.info(
                "flush.committed",
                block=block.block_id,
                rows=block.row_count,
                dead_letters=block.dead_count,
                seconds=round(took, 3),
                replica=result.rows.replica,
                checkpoint={p: r.last + 1 for p, r in parts.items()},
            )
        finally:
            self._flush_idle.set()

    def _flush_with_retry(self, block: PipelineBlock) -> Any:
        delay = BACKOFF_INITIAL_S
        attempt = 0
        while True:
            attempt += 1
            self._beat()
            self._wait_gate()
            try:
                return self.sink.flush(self._spark(), block, self._replicas())
            except Exception as exc:
                self._metrics.flushes.labels(**self._labels, result="error").inc()
                self._log.warning(
                    "flush.retry",
                    block=block.block_id,
                    attempt=attempt,
                    error=f"{type(exc).__name__}: {exc}"[:500],
                    backoff_s=delay,
                )
                if self._stop.wait(delay):
                    raise PipelineStopped("stopped while retrying a flush") from None
                delay = min(delay * 2, BACKOFF_MAX_S)

    def _wait_gate(self) -> None:
        while not self._gate.wait(0.2):
            self._beat()
            if self._stop.is_set():
                raise PipelineStopped("stopped while suspended")
        if self._stop.is_set() and self._abandoned.is_set():
            raise PipelineStopped("flush abandoned")

    def _truncate_wal(self) -> None:
        wal = self._wal
        if wal is None:
            return
        with self._index_lock:
            point = self._index.truncation_point(self._checkpoint)
        if point is not None:
            removed = wal.truncate_before(point)
            if removed:
                self._log.info(
                    "wal.truncated", segments=[p.name for p in removed], before=str(point)
                )

    # -- teardown ------------------------------------------------------------------------

    def _thread_done(self) -> None:
        """Called as each of the two threads ends; the last one releases consumer and WAL."""
        with self._done_lock:
            self._threads_done += 1
            if self._threads_done < 2:
                return
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            consumer.close()
        wal, self._wal = self._wal, None
        if wal is not None:
            wal.close()
        self._publish_buffer_gauges(released=True)
        for name in self._registered:
            self._catalog.remove(name)
        self._registered.clear()
        self._log.info("pipeline.released")


def _dedup_offsets(table: pa.Table) -> pa.Table:
    """Rows with distinct (`_partition`, `_offset`), first occurrence kept, sorted."""
    if table.num_rows == 0:
        return table
    table = table.sort_by([("_partition", "ascending"), ("_offset", "ascending")])
    p = table.column("_partition").combine_chunks()
    o = table.column("_offset").combine_chunks()
    if len(p) < 2:
        return table
    same = pc.and_(pc.equal(p[1:], p[:-1]), pc.equal(o[1:], o[:-1]))
    keep = pc.invert(pc.fill_null(same, False))
    mask = pa.concat_arrays([pa.array([True]), keep])
    return table.filter(mask)
