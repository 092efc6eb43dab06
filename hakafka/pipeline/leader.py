"""One pipeline of one shard while this node leads the shard.

Recovery, then two threads:

- recovery (on becoming leader, from local disk and ZooKeeper only): read checkpoint and
  pending; rebuild the pending block from the WAL when it has every offset (else the flush
  lane re-reads it from Kafka) and hand it to the flush lane; replay the WAL from after the
  pending block (or the checkpoint) into the buffer; assign the consumer after the last
  replayed offset. Nothing waits for Spark or ClickHouse: the flush lane re-flushes the
  pending block while the consumer already runs, and seals the next block only after it.
- consume (`consume.ConsumeLane`, on the pipeline thread): consume -> decode -> WAL append
  (+ sync per policy) -> buffer append. At the buffer limit the batch is held and the
  partitions pause until a flush commits. With several lanes (`lane_process`), processes
  consume and decode their parts of the shard's partitions, and this thread appends what
  they read.
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

import dataclasses
import threading
import time
from concurrent.futures import Future

import pyarrow as pa
import structlog

from buffer import Catalog, OffsetRange
from hakafka.config import PipelineBufferConfig, PipelineConfig
from hakafka.consumer import DecodeError, Decoder, ShardAssignment
from hakafka.consumer.partition_consumer import KafkaMetadataError
from hakafka.consumer.schema import dead_letter_arrow_schema
from hakafka.coordination import FencedError, paths
from hakafka.coordination.writers import WriterElsewhereError
from hakafka.faults import CrashPlan
from hakafka.metrics import Metrics
from hakafka.pipeline.buffer import PipelineBuffer
from hakafka.pipeline.consume import ConsumeLane, InlineSource
from hakafka.pipeline.context import PipelineContext
from hakafka.pipeline.flush import FlushLane, PendingReflush
from hakafka.pipeline.lane_process import ProcessLanes
from hakafka.pipeline.lane_rates import LaneView
from hakafka.pipeline.lane_reader import LaneReader
from hakafka.pipeline.meters import PipelineMeters
from hakafka.pipeline.parts import Consumer, LaneParts, PipelineParts, Wal
from hakafka.pipeline.push import (
    PushDesk,
    PushError,
    PushRefusedError,
    PushRequest,
    PushResult,
    PushView,
    conform,
    kafka_only,
    topic_of,
    writer_partition,
)
from hakafka.pipeline.replay import (
    LayoutError,
    PendingFromWal,
    PendingScan,
    ReplayCursor,
    WalIndex,
    check_layout,
    checkpoint_offsets,
    pending_ranges,
    record_ranges,
    select_rows,
)
from hakafka.pipeline.state import (
    PipelineState,
    PipelineStatus,
    PipelineStopped,
    Signals,
    Wait,
    Waiting,
)
from hakafka.pipeline.walcodec import SchemaChangeError, SchemaConverter
from hakafka.settings import thresholds_of
from retry_policy import Backoff

log = structlog.get_logger("hakafka.pipeline")

JOIN_TIMEOUT_S = 10.0
# How long a new instance waits for this node's previous one (stopped, its flush abandoned)
# to let go of the buffer's names and the WAL before it fails, asking every 0.2 s.
RELEASE_WAIT_S = 60.0
RELEASE_POLL = Backoff(0.2, 0.2)


class PreviousInstanceError(Exception):
    """This node's previous instance of the pipeline held the buffer's names (and the WAL)
    past the wait: the shard restarts the pipeline like any failed one."""


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
        assignment: ShardAssignment,
        rows_per_task: int,
        catalog: Catalog,
        metrics: Metrics,
        crash: CrashPlan | None = None,
        drain: bool = False,
        release_wait_s: float = RELEASE_WAIT_S,
    ) -> None:
        """`assignment` says which partitions the shard owns: WAL records of others (left by
        an earlier layout) are never replayed. With `drain`, the pipeline recovers, flushes and
        commits what its WAL and pending intent hold, consumes nothing, and ends `drained`.
        `release_wait_s`: how long recovery waits for this node's previous instance of the
        pipeline to let go of the buffer's names and the WAL."""
        self.config, self.shard, self.decoder = config, shard, decoder
        self.assignment, self.drain = assignment, drain
        self._release_wait_s = release_wait_s
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
        self._context = context = PipelineContext(
            config=config,
            buffer=self.buffer,
            index=self._index,
            signals=self._signals,
            status=self.status,
            meters=self._meters,
            crash=self._crash,
            log=self._log,
        )
        self._desk = PushDesk(lambda: self.buffer.limit_bytes, lambda: self.buffer.nbytes)
        self._writers: dict[str, int] = {}  # push writer -> its partition, this term
        self._consume = ConsumeLane(context, desk=self._desk, copies=parts.push_copies)
        self._schemas = SchemaConverter(config.name, decoder.schema)
        self._flush = FlushLane(context, thresholds_of(config), parts, decoder, rows_per_task)
        self._flush.desk = self._desk
        self._wal: Wal | None = None
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
        """Start recovery, then consumption, on the pipeline's own thread. Never raises: a
        pipeline that cannot start (a thread refused) is `failed` with the reason, so the
        shard restarts it like any failed pipeline."""
        try:
            self._main.start()
        except Exception as exc:
            self.status.error = f"could not start: {type(exc).__name__}: {exc}"
            self.status.enter(PipelineState.FAILED, self._log, error=self.status.error)

    def _take_tables(self) -> None:
        """Serve the buffer as this shard's part of `<pipeline>` and `<pipeline>_dead_letter`
        (`buffer.sql.Catalog`: one name per pipeline on a node, a `_shard` column). While this
        node's previous instance (stopped, its flush abandoned) holds them, and so the WAL,
        wait, saying so, up to `release_wait_s`; then PreviousInstanceError."""
        deadline = time.monotonic() + self._release_wait_s

        def held(exc: ValueError, _attempt: int, _delay: float) -> None:
            if time.monotonic() >= deadline:
                raise PreviousInstanceError(
                    f"this node's previous instance of the pipeline did not let go within "
                    f"{self._release_wait_s:g} s: {exc}"
                ) from None
            if self.status.wait(Waiting.PREVIOUS_INSTANCE, str(exc)):
                self._log.warning("pipeline.awaiting_previous_instance", held=str(exc))

        RELEASE_POLL.call(
            lambda: self.buffer.serve(self._catalog, self.shard),
            self._signals.waiter,
            retry_on=ValueError,
            stopped=lambda: PipelineStopped("stopped while the previous instance held the buffer"),
            on_retry=held,
        )
        self.status.done_waiting(Waiting.PREVIOUS_INSTANCE)

    def retune(self, buffer: PipelineBufferConfig) -> None:
        """Flush at `buffer`'s thresholds and hold at most its `limit_bytes` from now on (a
        reloaded config); the block in flight, if any, is not affected."""
        self.config = dataclasses.replace(self.config, buffer=buffer)
        self._flush.thresholds = thresholds_of(self.config)
        self.buffer.limit_bytes = buffer.limit_bytes
        self._log.info("pipeline.retuned", **dataclasses.asdict(buffer))

    def suspend(self) -> None:
        """Stop side effects at once (ZooKeeper connection lost); state is kept, and the
        time suspended counts as no progress."""
        self._signals.gate.clear()
        self.status.wait(Waiting.SUSPENDED, "ZooKeeper connection lost: side effects held")
        self._log.warning("pipeline.suspended")

    def resume(self) -> None:
        self.status.done_waiting(Waiting.SUSPENDED)
        self._signals.gate.set()
        self._log.info("pipeline.resumed")

    def stop(self, grace: float) -> bool:
        """Stop consuming now; let a flush in flight finish for up to `grace` s, else abandon
        it (its checkpoint is never committed). True if nothing was abandoned."""
        signals = self._signals
        signals.stop.set()  # every wait polls it; a closed gate stays closed (no side effects)
        clean = signals.flush_idle.wait(grace)
        if not clean:
            signals.abandoned.set()
            self._log.warning("flush.abandoned", grace_s=grace)
        for thread in (self._main, self._flusher):
            # Either may never have started (start failed, stopped during recovery); an
            # abandoned flush thread ends by itself once its insert returns.
            if thread.ident is not None and (clean or thread is self._main):
                thread.join(timeout=JOIN_TIMEOUT_S)
        return clean

    def push(self, writer: str, sequence: int, table: pa.Table, timeout: float) -> PushResult:
        """Apply `writer`'s batch `sequence` (`table`, the pipeline's declared columns) once,
        and answer when a checkpoint covers it (see `push.py`). PushError (nothing applied)
        when it does not fit the pipeline; PushOutOfOrderError when it is below the writer's
        position and was never applied; PushRefusedError when this term cannot take it now;
        TimeoutError after `timeout` s (it may still be applied: push it again, it is taken
        once)."""
        if self.status.state is not PipelineState.CONSUMING:
            raise PushRefusedError(
                f"pipeline {self.config.name} of shard {self.shard} is {self.status.state}",
                status=503,
                retry_after_s=1.0,
            )
        try:
            paths.check_name("writer", writer)
        except ValueError as exc:
            raise PushError(str(exc)) from None
        partition = self._writers.get(writer)
        if partition is None:
            try:
                number = self._parts.fenced.writer_number(self.config.name, writer)
            except WriterElsewhereError as exc:
                raise PushError(str(exc)) from None
            partition = self._writers.setdefault(writer, writer_partition(number))
        rows = conform(table, self.decoder.schema, partition, sequence)
        request = PushRequest(partition, sequence, rows)
        if request.nbytes > self.buffer.limit_bytes:
            raise PushError(
                f"{request.nbytes} bytes in one batch: more than the pipeline's buffer holds "
                f"(limit_bytes {self.buffer.limit_bytes}); push it in smaller batches"
            )
        self._desk.submit(request)
        try:
            return request.done.result(timeout)
        except TimeoutError:
            # Not applied yet: it never will be (the retry will). Applied: it still flushes.
            request.done.cancel()
            raise

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
        """Seconds without progress: since the least recent step of a running thread (a hung
        call), since a block in flight began without a commit (a flush that steps on but
        lands nothing: Spark still starting, an insert crawling), or since the oldest wait
        began (`status.waits`: suspended, Kafka or the topic missing, the schema registry
        away, flushes failing in a row, or the consumer paused at the buffer limit with no
        flush committed after). 0 when all goes on."""
        signals = self._signals
        return max(
            0.0, signals.stalled_for(now), signals.in_flight_for(now), *self._waited(now).values()
        )

    def state_name(self) -> str:
        """The state `hakafka_pipeline_state` shows: what a live pipeline waits for longest,
        else its `PipelineState`."""
        waits = self.status.current_waits()
        return waits[0].kind.value if waits and self.status.state.live else self.status.state

    def stall_reason(self, now: float) -> str:
        """What `stalled_for` measures, in words: the longest wait, a block in flight that
        does not commit, or a hung thread."""
        waited = self._waited(now)
        hung = self._signals.stalled_for(now)
        in_flight = self._signals.in_flight_for(now)
        longest = max(waited, key=lambda w: waited[w], default=None)
        if longest is not None and waited[longest] >= max(hung, in_flight):
            return longest.describe(now)
        if in_flight > hung:
            return f"a block in flight for {in_flight:.0f} s has not committed"
        return f"a thread made no step for {hung:.0f} s (a hung call: SIGUSR1 dumps the stacks)"

    def _waited(self, now: float) -> dict[Wait, float]:
        """Each wait in progress and the seconds it counts as no progress."""
        waited = {}
        for wait in self.status.current_waits():
            since = wait.since
            if wait.kind is Waiting.BUFFER_FULL:
                since = max(since, self._signals.committed_at)  # a commit meanwhile is progress
            waited[wait] = now - since
        return waited

    def lag(self) -> dict[int, int]:
        """Messages behind the fetched high watermark per partition (as of the last poll)."""
        return dict(self._consume.lag)

    def positions(self) -> dict[int, int]:
        """Next offset to consume per partition (as of the last poll)."""
        return dict(self._consume.positions)

    def lanes(self) -> list[LaneView]:
        """Each consume lane: the partitions it reads (as of the last poll; [] before), the
        rows it stored since the pipeline started reading, its recent rows/s and its lag."""
        return self._consume.rates.views(list(self._consume.lanes), dict(self._consume.lag))

    def pushes(self) -> PushView:
        """The pipeline's pushes: rows applied and their recent rate, writers, batches not
        yet answered, those whose copies are out, and those a re-flush awaits from their
        writers."""
        (view,) = self._consume.push_rates.views([[]], {})
        unanswered, awaited = self._desk.counts()
        writers = len(self._consume.pushed)
        copying = self._consume.copying
        return PushView(view.rows, view.rows_per_s, writers, unanswered, copying, awaited)

    # -- pipeline thread: recovery then consumption ----------------------------------------

    def _run(self) -> None:
        self._signals.beat()
        try:
            self.status.enter(PipelineState.RECOVERING, self._log)
            self._take_tables()
            wal = self._open_wal()
            starts, pending = self._recover()
            self._signals.check_stop("stopped during recovery")
            self._flusher.start()
            starts.update(self._replay(wal, starts, pending))
            self._crash.hit("recover.after_replay")
            if self.drain:
                self._await_drained()
                return
            self._consume.pushed = {p: o for p, o in starts.items() if p < 0}
            self._consume.recent = {}
            self._start_lanes(kafka_only(starts))
            self.status.enter(PipelineState.CONSUMING, self._log)
            self._consume.run(wal)
            self._set_stopped()
        except (PipelineStopped, FencedError) as exc:
            self._log.info("pipeline.stopped", reason=str(exc) or type(exc).__name__)
            self._set_stopped()
        except Exception as exc:
            permanent = isinstance(exc, (DecodeError, SchemaChangeError, LayoutError))
            self.status.fail(exc, self._log, restartable=not permanent)
        finally:
            self._desk.close(f"pipeline {self.status.state}")
            self._signals.beats_end()
            self._signals.stop.set()
            if self._flusher.ident is None:
                self._thread_done()  # the flusher never started: count it as done
            self._thread_done()

    def _start_lanes(self, starts: dict[int, int]) -> None:
        """Start reading from `starts`: in this thread, or in one process per lane when
        the parts ask for several and the shard owns more than one partition (a lane
        never reads nothing; counted once per term, from the topic's metadata)."""
        consumer, lanes = self._parts.consumer(), self._parts.lanes
        count = 1 if lanes is None else min(lanes.count, self._owned_count(consumer, lanes))
        if lanes is None or count <= 1:
            reader = LaneReader(
                self.config.name,
                self.config.topic,
                self.decoder,
                self._signals,
                self.status,
                self._log,
                self._crash,
            )
            self._consume.source = InlineSource(reader)
            reader.assign(consumer, starts)
            return
        consumer.close()
        source = ProcessLanes(
            dataclasses.replace(lanes, count=count), self.assignment, self._context
        )
        self._consume.source = source  # closed with the lane, even if a start fails
        # The lanes read while the others start: their rows count from here.
        self._consume.rates.sample()
        source.start(starts)

    def _owned_count(self, consumer: Consumer, lanes: LaneParts) -> int:
        """How many of the topic's partitions the shard owns (at most `lanes.count`: when
        metadata cannot be read now, as many as the lanes)."""
        try:
            return len(self.assignment.select(consumer.topic_partitions()))
        except KafkaMetadataError:
            return lanes.count

    def _await_drained(self) -> None:
        """Let the flush lane commit everything recovered, then end `drained` (or stopped,
        when stopped first; failed, when the flush lane failed)."""
        self.status.enter(PipelineState.DRAINING, self._log)
        self._signals.draining.set()
        while self._flusher.is_alive():
            self._signals.beat()
            self._flusher.join(0.2)
        if not self._flush.drained:
            raise PipelineStopped("stopped while draining")
        self.status.enter(PipelineState.DRAINED, self._log, checkpoint=self._flush.checkpoint)

    def _flush_thread(self) -> None:
        try:
            self._flush.run()
        finally:
            # The lanes live and die together: a flush lane that ended (fenced, failed) must
            # not leave the consumer filling a buffer that nothing drains.
            self._signals.stop.set()
            self._thread_done()

    def _set_stopped(self) -> None:
        """`stopped`, unless the flush thread failed first (its error is the story)."""
        self.status.enter(PipelineState.STOPPED, self._log)

    def _open_wal(self) -> Wal:
        self._wal = wal = self._parts.open_wal()
        self._flush.wal = wal
        report = wal.repair_report
        if not report.clean:
            self._log.error("wal.repaired", directory=str(wal.directory), report=repr(report))
        return wal

    def _recover(self) -> tuple[dict[int, int], PendingFromWal | None]:
        """Read checkpoint and pending from ZooKeeper and hand the pending block to the flush
        lane, its rows to follow from the WAL pass (`_replay`); return where this term's data
        starts (after the checkpoint, or after the pending block) and what that pass must
        gather for the block.

        Nothing here waits for Spark or ClickHouse: the flush lane re-flushes the pending
        block while the consumer already runs, and seals the next block only after it."""
        name, topic, fenced = self.config.name, self.config.topic, self._parts.fenced
        self._flush.checkpoint = checkpoint_offsets(fenced.read_checkpoint(name), topic)
        if (age := fenced.checkpoint_age(name)) is not None:
            # Until this term commits or finds nothing waiting (see ConsumeLane): the shard
            # has made no progress since its last checkpoint, whoever wrote it.
            self.status.wait(
                Waiting.CHECKPOINT_OVERDUE,
                "data waits and the shard's last checkpoint was written "
                f"{age:.0f} s before this term began",
                since=time.monotonic() - age,
            )
        pending = fenced.read_pending(name)
        self._log.info(
            "pipeline.recovering",
            checkpoint=self._flush.checkpoint,
            pending=None if pending is None else pending.block_id,
            epoch=fenced.epoch,
        )
        others = fenced.read_other_checkpoints(name)
        check_layout(topic, self.shard, self._flush.checkpoint, others, self.assignment)
        self._desk.committed(self._flush.checkpoint)
        starts = dict(self._flush.checkpoint)
        if pending is None:
            self._recover_copies()
            return starts, None
        # Before any push is taken: a writer's retry of a batch the block holds, however
        # early, goes aside for the re-flush in case no WAL here has it.
        self._desk.await_retries(pending.pushed)
        self._recover_copies()
        wanted = pending_ranges(pending, topic)
        gathered = PendingFromWal(pending.block_id, PendingScan(topic, wanted), Future())
        self._flush.pending = PendingReflush(pending, wanted, gathered.block)
        starts.update({p: rng.last + 1 for p, rng in wanted.items()})
        return starts, gathered

    def _recover_copies(self) -> None:
        """Hand the desk the pushed batches that nodes hold copies of and the checkpoint
        does not cover: answered pushes whose leader may have died before their flush (a
        batch this node's WAL has too is applied once: the desk sees it as a retry)."""
        copies = self._parts.push_copies
        if copies is None:
            return
        checkpoint = self._flush.checkpoint
        found = [b for b in copies.recover() if b.end > checkpoint.get(b.partition, -1)]
        if found:
            self._log.info(
                "push.recovered",
                batches=len(found),
                rows=sum(b.rows.num_rows for b in found),
            )
        self._desk.recover(found)

    def _replay(
        self, wal: Wal, starts: dict[int, int], pending: PendingFromWal | None
    ) -> dict[int, int]:
        """The one pass over the WAL before consuming: index every record, gather the
        pending block's rows (handed to the flush lane before the first replayed batch, or
        at the end), and put records at or past `starts` back into the buffer; return the
        next offset per partition the WAL had (a gap ends a partition's replay)."""
        topic = self.config.topic
        cursor = ReplayCursor(dict(starts))
        replayed = 0
        for record in wal.replay():
            self._signals.check_stop("stopped during replay")
            ranges = record_ranges(record, topic)
            owned = self._owned(ranges)
            self._index.add(record.position, owned)
            keep = cursor.accept(owned)
            batch = None
            if pending is not None and not pending.block.done():
                # In WAL order a block's records come before those consumed after its seal:
                # the first record to replay ends the search for the pending one.
                wanted = pending.scan.wants(ranges)
                batch = self._schemas.decode(record) if wanted or keep else None
                pending.scan.note(ranges, batch if wanted else None)
                if keep:
                    pending.hand_over(self.buffer.rows.schema, topic)
            if not keep:
                continue
            batch = batch or self._schemas.decode(record)
            rows = select_rows(batch.rows, keep)
            dead = select_rows(batch.dead_letters, keep) if batch.dead_letters is not None else None
            # May wait at the buffer's limit for a commit: the pending block is handed over.
            self._consume.append(rows, dead, {(topic_of(p, topic), p): r for p, r in keep.items()})
            replayed += rows.num_rows
        if pending is not None and not pending.block.done():
            pending.hand_over(self.buffer.rows.schema, topic)
        self.status.replayed_rows = replayed
        self._log.info(
            "wal.replayed",
            rows=replayed,
            next_offsets=cursor.next_offsets,
            gaps=sorted(cursor.closed),
        )
        return cursor.next_offsets

    def _owned(self, ranges: dict[int, OffsetRange]) -> dict[int, OffsetRange]:
        """The ranges of partitions this shard owns (a push writer's always): a WAL written
        under an earlier layout may hold others, whose checkpoints now live in their new
        shard."""
        return {p: r for p, r in ranges.items() if p < 0 or self.assignment.select([p])}

    # -- teardown ------------------------------------------------------------------------

    def _thread_done(self) -> None:
        """Called as each of the two threads ends; the last one releases consumer and WAL."""
        with self._done_lock:
            self._threads_done += 1
            if self._threads_done < 2:
                return
        try:
            try:
                self._consume.close()
            finally:  # the WAL's directory lock must go even if the consumer would not close
                wal, self._wal = self._wal, None
                self._flush.wal = None
                if wal is not None:
                    wal.close()
        finally:
            # Even if closing failed: the next pipeline of this name needs the buffer's names.
            self._meters.buffer(None)
            self._meters.lanes(0)
            self.buffer.unserve(self._catalog)
            self._log.info("pipeline.released")
