"""Several consume lanes of one pipeline, each reading in a process of its own.

Decoding holds the GIL (fastavro, protobuf and the JSON path walk are Python or Cython that
does not release it), so threads would read no faster than one; a process per lane does.
Each lane process owns a disjoint part of the shard's partitions (`ShardAssignment.for_lane`)
with its own consumer and decoder, and sends the pipeline thread what `LaneReader.take`
returns: the encoded WAL record and its offset ranges. The pipeline thread stays the only
writer of the WAL and the buffer (`consume.ConsumeLane.store`), so recovery, flushes, tokens
and checkpoints are those of one lane: a WAL record's ranges are contiguous per partition,
and a partition belongs to one lane for the whole term.

A lane process is started with `spawn` (the daemon has threads: a forked child would inherit
their locks held). It ends when the pipeline stops it, when its pipe closes (the daemon
died, even by kill -9), or when it fails: then it sends its exception and the pipeline
thread raises it, failing the term as one lane would. A lane that makes no step for
`LANE_SILENT_S` seconds fails the term too (a hung decoder must not leave its partitions
stuck while the others keep the shard looking healthy).
"""

from __future__ import annotations

import contextlib
import faulthandler
import gc
import multiprocessing
import pickle
import signal
import threading
import time
from collections.abc import MutableMapping
from dataclasses import dataclass, field, replace
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any, NoReturn

import structlog

from hakafka.consumer import OffsetReset, ShardAssignment
from hakafka.faults import CrashPlan
from hakafka.pipeline.context import PipelineContext
from hakafka.pipeline.lane_reader import POLL_TIMEOUT_S, LaneBatch, LaneReader
from hakafka.pipeline.parts import LaneParts
from hakafka.pipeline.state import PipelineStopped, Signals, Wait, Waiting

LANE_SILENT_S = 60.0  # a lane without a step for this long fails the term
BEAT_EVERY_S = 1.0  # how often a lane process reports a step while it waits
STOP_GRACE_S = 3.0  # a lane process asked to stop gets this long before it is killed


class LaneFailedError(RuntimeError):
    """A lane process ended without being asked to, or made no step for too long."""


# -- messages from a lane process ---------------------------------------------------------


@dataclass(frozen=True)
class _Ready:
    """The lane's consumer is assigned; batches follow."""


@dataclass(frozen=True)
class _Beat:
    """The lane made a step (while it waits, at most every BEAT_EVERY_S)."""


@dataclass(frozen=True)
class _Wait:
    kind: Waiting
    detail: str


@dataclass(frozen=True)
class _Done:
    kind: Waiting


@dataclass(frozen=True)
class _Log:
    level: str
    event: str
    fields: dict[str, Any]


@dataclass(frozen=True)
class _Reset:
    """The lane's consumer reset a partition's offset (`out_of_range = "earliest"`)."""

    reset: OffsetReset


@dataclass(frozen=True)
class _Failed:
    error: BaseException


@dataclass(frozen=True)
class _Stop:
    """From the pipeline thread: end the lane."""


# -- the lane process ---------------------------------------------------------------------


class _Pipe:
    """The lane process's end: what the reader reports goes to the pipeline thread."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._lock = threading.Lock()  # the reader's thread and structlog may both send
        self._waits: set[Waiting] = set()
        self._beaten = 0.0

    def send(self, message: object) -> None:
        with self._lock:
            self._conn.send(message)

    def batch(self, batch: LaneBatch) -> None:
        """Send `batch`: its fields pickled, its payload as raw bytes after them."""
        meta = replace(batch, payload=b"", decoded=None)
        with self._lock:
            self._conn.send(meta)
            if not batch.empty:
                self._conn.send_bytes(memoryview(batch.payload))
        self._beaten = time.monotonic()

    def beat(self) -> None:
        if time.monotonic() - self._beaten >= BEAT_EVERY_S:
            self._beaten = time.monotonic()
            self.send(_Beat())

    def wait(self, kind: Waiting, detail: str) -> bool:
        self.send(_Wait(kind, detail))
        new = kind not in self._waits
        self._waits.add(kind)
        return new

    def done_waiting(self, kind: Waiting) -> Wait | None:
        if kind not in self._waits:
            return None
        self._waits.discard(kind)
        self.send(_Done(kind))
        return Wait(kind, time.monotonic(), "")

    def reset(self, reset: OffsetReset) -> None:
        """The consumer's `on_reset`: counted by the pipeline thread."""
        self.send(_Reset(reset))

    def forward_log(self, _logger: Any, level: str, event: MutableMapping[str, Any]) -> NoReturn:
        """A structlog processor: the event goes to the pipeline's log, not to this
        process's output."""
        fields = {k: v for k, v in event.items() if k != "event"}
        self.send(_Log(level, str(event.get("event", "")), _picklable(fields)))
        raise structlog.DropEvent


def sendable(exc: BaseException) -> BaseException:
    """`exc` if it survives pickling both ways (the pipeline thread raises it as it is),
    else a LaneFailedError naming it."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return LaneFailedError(f"{type(exc).__name__}: {exc}")


def _picklable(fields: dict[str, Any]) -> dict[str, Any]:
    try:
        pickle.dumps(fields)
        return fields
    except Exception:
        return {k: repr(v) for k, v in fields.items()}


class _LaneSignals(Signals):
    """A lane process's signals: every step also tells the pipeline thread it lives."""

    def __init__(self, pipe: _Pipe) -> None:
        self._pipe = pipe
        super().__init__()

    def beat(self) -> None:
        super().beat()
        self._pipe.beat()


def _watch_parent(conn: Connection, stop: threading.Event) -> None:
    """Set `stop` when the pipeline asks, or when its end of the pipe closes."""
    try:
        while not isinstance(conn.recv(), _Stop):
            pass
    except (EOFError, OSError):
        pass
    stop.set()


@dataclass(frozen=True)
class LaneJob:
    """One lane process's work, pickled to it: read `assignment` (the lane's part of the
    shard) of `topic` from `starts` for `pipeline`."""

    parts: LaneParts
    pipeline: str
    topic: str
    assignment: ShardAssignment
    starts: dict[int, int]
    # The daemon's collector thresholds (a decoded batch keeps 10^4 objects alive: at
    # CPython's defaults the collector would take a third of decoding).
    gc_thresholds: tuple[int, ...] = field(default_factory=gc.get_threshold)


def lane_main(job: LaneJob, conn: Connection) -> None:
    """A lane process: read the job's partitions and send every batch to the pipeline
    thread until told to stop."""
    # As the daemon: SIGUSR1 dumps every thread's stack to stderr (the daemon's).
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    gc.set_threshold(*job.gc_thresholds)
    pipe = _Pipe(conn)
    structlog.configure(processors=[pipe.forward_log], cache_logger_on_first_use=True)
    signals = _LaneSignals(pipe)
    threading.Thread(
        target=_watch_parent, args=(conn, signals.stop), name="lane-watch", daemon=True
    ).start()
    log = structlog.get_logger("hakafka.lane")
    reader = LaneReader(
        job.pipeline,
        job.topic,
        job.parts.decoder(),
        signals,
        pipe,
        log,
        CrashPlan.from_environment(),
    )
    try:
        reader.assign(job.parts.consumer(job.assignment, on_reset=pipe.reset), job.starts)
        pipe.send(_Ready())
        while not signals.stop.is_set():
            pipe.batch(reader.take())
    except PipelineStopped:
        pass
    except (BrokenPipeError, EOFError, ConnectionResetError):
        pass  # the pipeline went away: nothing to tell
    except BaseException as exc:
        pipe.send(_Failed(sendable(exc)))
    finally:
        reader.close()


# -- the pipeline thread's side -----------------------------------------------------------


@dataclass
class _Lane:
    index: int
    process: BaseProcess
    conn: Connection
    positions: dict[int, int] = field(default_factory=dict)
    lag: dict[int, int] = field(default_factory=dict)
    heard: float = field(default_factory=time.monotonic)
    ready: bool = False


class ProcessLanes:
    """The pipeline thread's handle on its lane processes: a `consume.BatchSource`."""

    def __init__(
        self, parts: LaneParts, assignment: ShardAssignment, context: PipelineContext
    ) -> None:
        """Lanes of `context`'s pipeline over `assignment` (the shard's partitions), made
        by `parts`; they report to `context.status` and log through `context.log`."""
        self._parts, self._assignment = parts, assignment
        self._pipeline, self._topic = context.config.name, context.config.topic
        self._status, self._signals = context.status, context.signals
        self._log, self._meters = context.log, context.meters
        self._lanes: list[_Lane] = []
        self._waits: dict[Waiting, set[int]] = {}
        self._polled = time.monotonic()
        self._early: list[LaneBatch] = []

    def start(self, starts: dict[int, int]) -> None:
        """Start every lane, each from the offsets of its own partitions, and return once
        each has assigned its consumer (waiting, beating, while one waits for Kafka).
        PipelineStopped if the pipeline stops first; what a lane failed with if it fails."""
        spawn = multiprocessing.get_context("spawn")
        for index in range(self._parts.count):
            lane_assignment = self._assignment.for_lane(index, self._parts.count)
            mine = {p: o for p, o in starts.items() if lane_assignment.select([p])}
            ours, theirs = spawn.Pipe(duplex=True)
            job = LaneJob(self._parts, self._pipeline, self._topic, lane_assignment, mine)
            process = spawn.Process(
                target=lane_main,
                args=(job, theirs),
                name=f"lane-{self._pipeline}-{self._assignment.shard}-{index}",
                daemon=True,
            )
            process.start()
            theirs.close()
            self._lanes.append(_Lane(index, process, ours))
        while not all(lane.ready for lane in self._lanes):
            self._signals.check_stop("stopped while the lanes started")
            # A lane ready first reads on: what it sends is kept for the first poll.
            self._early += self._receive(POLL_TIMEOUT_S)
        self._log.info(
            "lanes.started",
            lanes=len(self._lanes),
            pids=self.pids(),
        )

    def poll(self, timeout_s: float = POLL_TIMEOUT_S) -> list[LaneBatch]:
        now = time.monotonic()
        if now - self._polled > BEAT_EVERY_S:
            # The pipeline thread was away (a full buffer, a closed gate): the lanes were
            # blocked on their pipes, not silent.
            for lane in self._lanes:
                lane.heard = now
        batches, self._early = self._early + self._receive(timeout_s), []
        self._polled = time.monotonic()
        for lane in self._lanes:
            silent = self._polled - lane.heard
            if silent > LANE_SILENT_S:
                raise LaneFailedError(
                    f"lane {lane.index} (pid {lane.process.pid}) made no step for {silent:.0f} s"
                )
        return batches

    def _receive(self, timeout_s: float) -> list[LaneBatch]:
        """What the lanes sent, waiting up to `timeout_s` for the first of it."""
        by_conn = {lane.conn: lane for lane in self._lanes}
        batches: list[LaneBatch] = []
        for conn in wait(list(by_conn), timeout_s):
            lane = by_conn[conn]  # type: ignore[index]
            # What is there now, not more: a fast lane must not keep the others waiting.
            for _ in range(16):
                batch = self._take(lane)
                if batch is not None:
                    batches.append(batch)
                if not lane.conn.poll(0):
                    break
        return batches

    def _take(self, lane: _Lane) -> LaneBatch | None:
        """Handle one message of `lane`; a batch is returned."""
        try:
            message = lane.conn.recv()
            payload = (
                lane.conn.recv_bytes()
                if isinstance(message, LaneBatch) and not (message.empty)
                else b""
            )
        except (EOFError, OSError):
            lane.process.join(STOP_GRACE_S)
            raise LaneFailedError(
                f"lane {lane.index} (pid {lane.process.pid}) ended with exit code "
                f"{lane.process.exitcode}"
            ) from None
        lane.heard = time.monotonic()
        match message:
            case LaneBatch():
                lane.positions, lane.lag = message.positions, message.lag
                return replace(message, lane=lane.index, payload=payload)
            case _Ready():
                lane.ready = True
            case _Wait(kind, detail):
                self._waits.setdefault(kind, set()).add(lane.index)
                self._status.wait(kind, detail)
            case _Done(kind):
                waiting = self._waits.get(kind, set())
                waiting.discard(lane.index)
                if not waiting:
                    self._status.done_waiting(kind)
            case _Reset(reset):
                self._meters.offset_reset(reset)
            case _Log(level, event, fields):
                getattr(self._log, level, self._log.info)(event, lane=lane.index, **fields)
            case _Failed(error):
                raise error
        return None

    def positions(self) -> dict[int, int]:
        return {p: o for lane in self._lanes for p, o in lane.positions.items()}

    def lag(self) -> dict[int, int]:
        return {p: n for lane in self._lanes for p, n in lane.lag.items()}

    def lanes(self) -> list[list[int]]:
        return [sorted(lane.positions) for lane in self._lanes]

    def pause(self) -> None:
        """Nothing to do: a lane whose pipe is not read blocks on its next send, and its
        consumer's fetch queue is bounded (librdkafka's queued.max.messages.kbytes)."""

    def resume(self) -> None:
        """See `pause`."""

    def pids(self) -> list[int]:
        return [lane.process.pid for lane in self._lanes if lane.process.pid is not None]

    def close(self) -> None:
        """Stop every lane: ask, then (after STOP_GRACE_S) terminate and kill."""
        for lane in self._lanes:
            with contextlib.suppress(OSError, ValueError):
                lane.conn.send(_Stop())
            lane.conn.close()  # a lane blocked on a send sees its pipe break
        deadline = time.monotonic() + STOP_GRACE_S
        for lane in self._lanes:
            lane.process.join(max(0.0, deadline - time.monotonic()))
            if lane.process.is_alive():
                lane.process.terminate()
                lane.process.join(STOP_GRACE_S)
            if lane.process.is_alive():
                lane.process.kill()
                lane.process.join(STOP_GRACE_S)
        self._lanes.clear()
