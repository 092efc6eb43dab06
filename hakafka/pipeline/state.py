"""A pipeline's state and what `status` shows of it; the signals its two threads share."""

from __future__ import annotations

import errno
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from enum import StrEnum

from structlog.typing import FilteringBoundLogger

from retry_policy import Waiter


class PipelineState(StrEnum):
    STARTING = "starting"
    RECOVERING = "recovering"
    CONSUMING = "consuming"
    DRAINING = "draining"
    DRAINED = "drained"
    FAILED = "failed"
    STOPPED = "stopped"

    @property
    def live(self) -> bool:
        """Starting, recovering, consuming or draining: a leader in good health."""
        return self in (
            PipelineState.STARTING,
            PipelineState.RECOVERING,
            PipelineState.CONSUMING,
            PipelineState.DRAINING,
        )


class Waiting(StrEnum):
    """Why a live pipeline moves no data right now: each a named state with its age in
    `status`, `/status` and `hakafka_pipeline_state`; past `stuck_after` the node is not
    ready, with the wait as the reason."""

    SUSPENDED = "suspended"
    """The ZooKeeper connection is lost: side effects are held until the term is confirmed."""
    KAFKA_UNREACHABLE = "kafka_unreachable"
    """Topic metadata cannot be read: no broker answers (or the topic reports errors)."""
    TOPIC_MISSING = "waiting_for_topic"
    """The topic does not exist (a typo, or not created yet)."""
    REGISTRY_UNAVAILABLE = "registry_unavailable"
    """The schema registry cannot answer: the batch is decoded again once it does."""
    RETRYING_CLICKHOUSE = "retrying_clickhouse"
    """Flushes (or table creation) fail in a row: the block is retried."""
    BUFFER_FULL = "buffer_full"
    """Consumption paused at the buffer limit until a flush commits."""
    PUSH_RETRIES = "awaiting_push_retries"
    """The pending block holds pushed batches no WAL here has: flushed once their writers
    push them again (they were never answered)."""
    PREVIOUS_INSTANCE = "awaiting_previous_instance"
    """This node's previous instance of the pipeline (stopped, its flush abandoned) still
    holds the buffer's names and the WAL until its insert returns: recovery starts once it
    lets go."""
    CHECKPOINT_OVERDUE = "checkpoint_overdue"
    """A new term found data waiting (a pending block, WAL rows, Kafka lag) and has not
    committed yet: counted from the shard's last checkpoint, by whichever term wrote it, so
    a shard stalled across a leadership change is not reported as freshly started."""


@dataclass(frozen=True)
class Wait:
    """One wait in progress: what, since when (monotonic time), and the error or detail."""

    kind: Waiting
    since: float
    detail: str

    def describe(self, now: float) -> str:
        """`waiting_for_topic for 35 s: topic clicks does not exist`."""
        return f"{self.kind} for {now - self.since:.0f} s: {self.detail}"


class PipelineStopped(Exception):  # noqa: N818 - a control-flow signal, not an error
    """The pipeline was asked to stop while waiting."""


RECENT_FLUSHES = 10  # the committed blocks status keeps, newest last
# errno values of a disk that fails writes whoever asks: full, read-only, broken, over quota.
_DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EROFS, errno.EIO, errno.EDQUOT})


def local_disk_fault(exc: BaseException) -> bool:
    """True if `exc` is this node's file system failing (a path it cannot create, open or
    write: a `data_dir` under a regular file, no permission, a full or read-only disk):
    restarting here fails the same way, another node would not."""
    if not isinstance(exc, OSError):
        return False
    return exc.filename is not None or exc.errno in _DISK_ERRNOS


@dataclass(frozen=True)
class Flush:
    """One committed block: its id, rows, the seconds its flush took, when it committed."""

    block_id: str
    rows: int
    seconds: float
    at: float


@dataclass
class PipelineStatus:
    """What `status` shows of a running pipeline."""

    state: PipelineState = PipelineState.STARTING
    error: str | None = None
    flushes: deque[Flush] = field(default_factory=lambda: deque(maxlen=RECENT_FLUSHES))
    pending_block: str | None = None
    reflushing: bool = False  # the block in flight is one a former leader left pending
    # What it waits for now, by kind; each lane sets and clears its own kinds.
    waits: dict[Waiting, Wait] = field(default_factory=dict)
    checkpoint: dict[int, int] = field(default_factory=dict)
    replayed_rows: int = 0
    refetched_rows: int = 0
    restarts: int = 0
    # False when a restart would fail the same way: a bad message with `on_error = "fail"`
    # waits for ops (as a failed Kafka Connect task does), it is not retried.
    restartable: bool = True
    # True when it failed on this node's own disk: the shard should move to another node.
    local_fault: bool = False

    def wait(self, kind: Waiting, detail: str, since: float | None = None) -> bool:
        """Record that the pipeline waits for `kind` (keeping when it began; a new wait
        began now, or at `since`, monotonic time); True if the wait is new."""
        began = self.waits.get(kind)
        if began is not None:
            since = began.since
        elif since is None:
            since = time.monotonic()
        self.waits[kind] = Wait(kind, since, detail)
        return began is None

    def done_waiting(self, kind: Waiting) -> Wait | None:
        """The wait for `kind` is over; returns it (None if there was none)."""
        return self.waits.pop(kind, None)

    def current_waits(self) -> list[Wait]:
        """Every wait in progress, the longest first."""
        return sorted(list(self.waits.values()), key=lambda w: w.since)

    @property
    def flush_error(self) -> str | None:
        """While flushes (or table creation) fail in a row: the last error."""
        wait = self.waits.get(Waiting.RETRYING_CLICKHOUSE)
        return None if wait is None else wait.detail

    @property
    def registry_error(self) -> str | None:
        """While the schema registry cannot answer: its error."""
        wait = self.waits.get(Waiting.REGISTRY_UNAVAILABLE)
        return None if wait is None else wait.detail

    def fail(self, exc: BaseException, log: FilteringBoundLogger, *, restartable: bool) -> None:
        """Record `exc` as the reason the pipeline failed, and enter `failed`."""
        self.error = f"{type(exc).__name__}: {exc}"
        self.restartable = restartable
        self.local_fault = local_disk_fault(exc)
        self.enter(
            PipelineState.FAILED,
            log,
            error=self.error,
            restartable=restartable,
            local_fault=self.local_fault,
        )

    def enter(self, state: PipelineState, log: FilteringBoundLogger, **fields: object) -> None:
        """Move to `state` and log `pipeline.<state>` (every change of state is logged).
        `failed` is final: a lane that failed is not overwritten by the other lane's
        progress (a restart makes a new pipeline)."""
        if self.state is PipelineState.FAILED:
            return
        self.state = state
        level = "error" if state is PipelineState.FAILED else "info"
        getattr(log, level)(f"pipeline.{state.value}", **fields)


class Signals:
    """The events the consume and flush lanes of one pipeline share, and their heartbeats.

    - `stop`: the pipeline ends; every wait checks it.
    - `gate`: set while side effects are allowed (cleared while ZooKeeper is suspended).
    - `commits`: how many flushes committed; a batch held at the buffer limit goes in after
      the next one (a counter, not an event: a commit between the refusal and the wait must
      not be lost).
    - `flush_idle`: no block is in flight (what `stop` waits for within its grace).
    - `abandoned`: stop's grace ran out: the block in flight must not commit.
    - `draining`: nothing more is consumed; the flush lane seals and commits what the buffer
      holds, whatever the thresholds, and ends once it is empty.
    - `waiter`: how either lane's thread waits (`retry_policy.Waiter`): beating, until `stop`.
    """

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.gate = threading.Event()
        self.gate.set()
        self.commits = 0
        self.committed_at = time.monotonic()  # the last commit, or the start
        self._committed = threading.Condition()
        self.flush_idle = threading.Event()
        self.flush_idle.set()
        self.flush_began = time.monotonic()  # when the block in flight (if any) began
        self.abandoned = threading.Event()
        self.draining = threading.Event()
        # Thread id -> monotonic time of its last step; a running thread that stops stepping
        # (a hung disk, driver or call) makes the pipeline stuck.
        self._beats: dict[int, float] = {}
        self.waiter = Waiter(self.stop, self.beat)

    def note_commit(self) -> None:
        """A flush committed: wake batches waiting for room."""
        with self._committed:
            self.commits += 1
            self.committed_at = time.monotonic()
            self._committed.notify_all()

    def wait_commit(self, seen: int, timeout: float) -> bool:
        """True once `commits` has moved past `seen` (at once if it already has)."""
        with self._committed:
            return self._committed.wait_for(lambda: self.commits != seen, timeout)

    def begin_flush(self) -> None:
        """A block is in flight from now (`stop` waits for it within its grace)."""
        self.flush_began = time.monotonic()
        self.flush_idle.clear()

    def in_flight_for(self, now: float) -> float:
        """Seconds a block has been in flight without a commit (0: none is): a flush that
        runs on, stepping all the while (waiting for Spark to start, a slow insert), moves no
        data either."""
        if self.flush_idle.is_set():
            return 0.0
        return max(0.0, now - max(self.flush_began, self.committed_at))

    def beat(self) -> None:
        """The calling thread made a step."""
        self._beats[threading.get_ident()] = time.monotonic()

    def beats_end(self) -> None:
        """The calling thread ended: it no longer counts towards `stalled_for`."""
        self._beats.pop(threading.get_ident(), None)

    def stalled_for(self, now: float) -> float:
        """Seconds since the least recent step of a running thread (0: none runs)."""
        beats = list(self._beats.values())
        return max(0.0, now - min(beats)) if beats else 0.0

    def check_stop(self, why: str) -> None:
        """A step of the calling thread: beat, and raise PipelineStopped(`why`) if the pipeline
        is stopping."""
        self.beat()
        if self.stop.is_set():
            raise PipelineStopped(why)

    def wait_gate(self) -> None:
        """Return once side effects are allowed; PipelineStopped if the pipeline stops first,
        or if the block in flight was abandoned."""
        if not self.waiter.until(self.gate.wait):
            raise PipelineStopped("stopped while suspended")
        if self.stop.is_set() and self.abandoned.is_set():
            raise PipelineStopped("flush abandoned")
