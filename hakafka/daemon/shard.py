"""One shard on this node: stand in its election and run its pipelines while leading.

Leadership events arrive on the coordinator's notifier thread and are handled here, in
order, on the shard's own thread (pipelines take seconds to start and stop; the election
must not wait for that):

- BecameLeader: start every pipeline of the shard (each recovers, then consumes); the
  `leader` znode says `consuming` once all of them do.
- Suspended / Resumed: pipelines stop / resume side effects, keeping their state.
- LostLeadership: pipelines stop at once (their epoch is gone; nothing more is committed).
- FailoverRequested: pipelines stop, an in-flight flush may finish within the grace period,
  then the leadership is resigned.

Whether the node stands at all is decided from outside (`stand`, `withdraw`: the daemon's
`SettingsGuard` withdraws a node whose shard-wide settings differ from the recorded ones).
A withdrawal stops the pipelines like a hand-over (a flush in flight may finish within the
grace period) and leaves the election. The shard thread keeps the wanted candidacy and
reconciles it on every supervision tick, so a join that failed (ZooKeeper away) is retried.

While a reshard is in progress (`reshard(True)`, from the daemon's `ReshardFollower`), the
term's pipelines run in drain mode: they commit everything they hold and consume nothing;
once all are drained the shard reports it in `/reshard/<shard>` (fenced by the term), and
holds its leadership idle until the reshard ends (`reshard(False)`: consume again).

A pause with a deadline (made by `offsets set` or `pending drop` for their own duration) is
resumed by the leader once the deadline passes (`pipeline.pause_expired`): the command
died half-way. A pipeline ops paused (`hakafka pipeline pause`, `shards/<s>/paused/<pipeline>`,
watched here) does not run in any term: it stops (a flush in flight may finish within the grace),
and the leader records in the flag that it stopped in its term, which lets ops move its
offsets or drop its pending block. Resumed, it starts like a new term's pipeline (recovery
from checkpoint, pending intent and WAL). Drain mode ignores pauses: a reshard needs every
pipeline to commit what it holds, and a drained pipeline consumes nothing anyway.

A pipeline that fails while the term holds (the broker or ClickHouse away during recovery, a
flush that cannot land) is restarted within the same term after a growing delay (1 s, 2 s,
4 s, ... 30 s), as Flink's exponential-delay restart strategy does: a transient outage heals
without ops, and `status` shows the error and the restart count meanwhile. A bad message under
`on_error = "fail"` is not retried: the pipeline stays failed (the node unhealthy, the systemd
watchdog unfed) until ops act.

A leader that keeps failing hands the shard over, as HaKafka yields to a healthier replica:
after `HandoverPolicy.failures` failed runs of a pipeline within its window, or at once for a
failure of this node's own disk (its `data_dir` or WAL directory), it stops its pipelines,
leaves the election (`leader.handing_over`, with the reason) and stands again only after the
policy's cool-down. It does so only while another node stands in the shard: the
last candidate keeps the shard and keeps restarting (`leader.no_one_to_hand_over_to`).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import structlog

from hakafka.config import Config
from hakafka.coordination import (
    BecameLeader,
    CoordinationError,
    Coordinator,
    DrainedInfo,
    FailoverRequested,
    FencedError,
    HeldBy,
    Leadership,
    LeadershipEvent,
    LeadershipState,
    LostLeadership,
    Resumed,
    Suspended,
)
from hakafka.metrics import Metrics
from hakafka.pipeline import PipelineLeader, PipelineState

log = structlog.get_logger("hakafka.shard")

RECOVERY_TIMEOUT_S = 300.0
# An ops failover lets a flush in flight finish for this long, then abandons it: the flush is
# idempotent and its pending intent makes the next leader flush the same block again.
HANDOVER_GRACE_S = 0.5
SUPERVISE_EVERY_S = 0.5
RESTART_DELAY_S = (1.0, 30.0)  # first and largest delay before restarting a failed pipeline
RESTART_RESET_S = 600.0  # a pipeline that ran this long since its last restart starts over at 1 s
PAUSE_CHECK_S = 2.0  # how often a leader reads its pause flags for a passed deadline
_STOP = object()


def restart_delay(attempt: int) -> float:
    """Seconds to wait before restart number `attempt` (1-based): 1, 2, 4, ... at most 30."""
    first, largest = RESTART_DELAY_S
    return float(min(largest, first * 2 ** min(attempt - 1, 16)))


@dataclass(frozen=True)
class _Candidacy:
    """Whether this node should stand in the shard, and why not."""

    stand: bool
    reason: str = ""


@dataclass(frozen=True)
class _Reshard:
    """The reshard in progress (its `request` id), or None when none is."""

    request: str | None


@dataclass(frozen=True)
class _Pauses:
    """The pipelines ops paused in this shard, by name."""

    names: frozenset[str]


@dataclass
class _Restarts:
    """Restart bookkeeping of one pipeline (its failures are kept across terms)."""

    count: int = 0
    last_at: float | None = None
    failed_at: float | None = None
    failures: list[float] = field(default_factory=list)  # monotonic times, within the window


@dataclass(frozen=True)
class HandoverPolicy:
    """When a failing leader hands its shard over, and for how long it then stays out."""

    failures: int = 3
    """Failed runs of one pipeline within `window_s` that hand the shard over."""
    window_s: float = 300.0
    cooldown_s: float = 60.0
    """How long a node that handed a shard over stays out of its election."""


@dataclass(frozen=True)
class Cooldown:
    """This node handed the shard over: it stands again at `until` (monotonic time)."""

    until: float
    reason: str
    at: float = field(default_factory=time.time)
    """Unix time of the hand-over."""


class ShardRunner:
    """The candidacy of this node in one shard and, while leading, its pipelines.

    `make_pipelines(leadership, only, drain)` builds the pipelines of a term, unstarted: all
    of them, or with `only` the one of that name (to restart it without touching the others);
    with `drain`, in drain mode (a reshard is in progress).
    """

    def __init__(
        self,
        shard: int,
        coordinator: Coordinator,
        make_pipelines: Callable[[Leadership, str | None, bool], list[PipelineLeader]],
        *,
        metrics: Metrics,
        flush_grace_s: float,
        stuck_after_s: float,
        warm_up: Callable[[], object] | None = None,
        handover: HandoverPolicy = HandoverPolicy(),
    ) -> None:
        self.shard = shard
        self._coordinator, self._make_pipelines = coordinator, make_pipelines
        self._metrics = metrics
        self._elected = False  # what the leader metric says (leader.elected to its end)
        # Every node serving the shard exports it (0 on followers): "no leader" is then
        # `sum by (shard) (hakafka_leader) == 0` across the cluster.
        metrics.leader.labels(shard=str(shard)).set(0)
        self._grace, self._stuck_after = flush_grace_s, stuck_after_s
        self._stuck: set[str] = set()  # pipelines reported stuck, until they step again
        self._warm_up = warm_up
        self._events: queue.Queue[Any] = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name=f"shard-{shard}", daemon=True)
        self.leadership: Leadership | None = None
        self.pipelines: list[PipelineLeader] = []
        self.leading_since: float | None = None
        self._restarts: dict[str, _Restarts] = {}
        self._wanted = _Candidacy(stand=False, reason="not started")
        self.standing = False
        """True while this node is a candidate (or the leader) of the shard."""
        self._draining = False  # a reshard is in progress: pipelines drain, then hold
        self._reshard: str | None = None  # the id of that reshard
        self._drained_reported = False  # this term's drained report for it is written
        self.cooldown: Cooldown | None = None
        """Set while this node stays out of the election after handing the shard over."""
        self.paused: frozenset[str] = frozenset()
        """The pipelines ops paused in this shard (they run in no term)."""
        self._acknowledged: set[str] = set()  # paused pipelines this term reported stopped
        self._pauses_checked = 0.0  # monotonic time the pause deadlines were last read
        self._resumed: set[str] = set()  # resumed by ops, not started yet (term suspended)
        self._log = log.bind(shard=shard)
        self._handover = handover

    def start(self) -> None:
        """Handle events from now on; the node stands once `stand()` is called."""
        self._thread.start()
        self._coordinator.pauses.watch(self.shard, lambda names: self._events.put(_Pauses(names)))

    def stand(self) -> None:
        """Stand for leadership (again); a no-op while standing."""
        self._events.put(_Candidacy(stand=True))

    def withdraw(self, reason: str) -> None:
        """Stop the pipelines as for a hand-over and leave the election until `stand()`."""
        self._events.put(_Candidacy(stand=False, reason=reason))

    def retune(self, config: Config, stuck_after_s: float) -> None:
        """Apply a reloaded config's live settings: each running pipeline's `[buffer]`
        thresholds and limit, and `stuck_after`. Called from the main thread: both are plain
        reads for the threads that use them."""
        self._stuck_after = stuck_after_s
        buffers = {p.name: p.buffer for p in config.pipelines}
        for p in list(self.pipelines):
            if (buffer := buffers.get(p.config.name)) is not None:
                p.retune(buffer)

    def reshard(self, request: str | None) -> None:
        """The reshard in progress (an id: drain and hold, and report it) or None (it ended:
        consume again)."""
        self._events.put(_Reshard(request))

    def stop(self, grace: float) -> None:
        """Stop the pipelines (a flush may finish within `grace` s) and leave the election."""
        self._events.put(_STOP)
        self._thread.join(timeout=grace + 15.0)
        self._stop_pipelines(grace, reason="shutdown")
        try:
            self._coordinator.leave(self.shard)
        except Exception as exc:
            self._log.warning("shard.leave_failed", error=repr(exc))

    @property
    def leading(self) -> bool:
        """True while a term of this node runs here (its pipelines may all be paused)."""
        return self.leading_since is not None

    def healthy(self) -> bool:
        """False if the shard's event thread died or a pipeline failed, stopped or is stuck
        while leading (see `problems`)."""
        return not self.problems(time.monotonic())

    def problems(self, now: float) -> list[str]:
        """Why this shard makes the node not ready, one line each ([] when it is ready): its
        event thread is not running (not started yet, or died), or a pipeline of its term
        failed, stopped, or made no progress for `stuck_after_s` (a hung thread, or a wait:
        suspended, Kafka or the topic missing, the registry away, ClickHouse failing, the
        buffer full, a checkpoint overdue)."""
        found = []
        if not self._thread.is_alive():
            started = self._thread.ident is not None
            found.append(
                f"shard {self.shard}: "
                + ("its event thread died" if started else "not started yet")
            )
        for p in self.pipelines:
            where, state = f"shard {self.shard} pipeline {p.config.name}", p.status.state
            if not (state.live or state is PipelineState.DRAINED):
                error = p.status.error
                found.append(f"{where}: {state}" + (f": {error}" if error else ""))
            elif (stalled := p.stalled_for(now)) >= self._stuck_after:
                found.append(
                    f"{where}: no progress for {stalled:.0f} s (bound {self._stuck_after:.0f} s):"
                    f" {p.stall_reason(now)}"
                )
        return found

    def _loop(self) -> None:
        while True:
            try:
                event = self._events.get(timeout=SUPERVISE_EVERY_S)
            except queue.Empty:
                event = None
            if event is _STOP:
                return
            try:
                if isinstance(event, _Candidacy):
                    self._wanted = event
                    self._reconcile_candidacy()
                elif isinstance(event, _Reshard):
                    self._set_draining(event.request)
                elif isinstance(event, _Pauses):
                    self._set_paused(event.names)
                elif event is None:
                    self._reconcile_candidacy()
                    self._supervise(time.monotonic())
                else:
                    self._handle(event)
            except Exception as exc:
                kind = type(event).__name__ if event is not None else "supervise"
                self._log.error("shard.event_failed", kind=kind, error=repr(exc))

    def _reconcile_candidacy(self) -> None:
        """Join or leave the election as `_wanted` says (shard thread only)."""
        if self.cooldown is not None and time.monotonic() >= self.cooldown.until:
            self._log.info("shard.cooldown_over", reason=self.cooldown.reason)
            self.cooldown = None
        if self._wanted.stand and not self.standing and self.cooldown is None:
            self.leadership = self._coordinator.join(self.shard, on_change=self._events.put)
            self.standing = True
            self._log.info("shard.standing")
        elif not self._wanted.stand and self.standing:
            self._log.warning("shard.withdrawing", reason=self._wanted.reason)
            self._stop_pipelines(HANDOVER_GRACE_S, reason=self._wanted.reason)
            self._mark_elected(False)
            # Left, the old candidacy emits only its LostLeadership (before any later join's
            # events: one notifier delivers them in order), which finds nothing to stop.
            self._coordinator.leave(self.shard)
            self.standing = False

    def _supervise(self, now: float) -> None:
        """Restart, after its delay, every pipeline whose threads ended while the term holds.

        Only the shard thread starts and stops pipelines, so one that is no longer running
        here ended on its own: it failed.
        """
        self._report_stuck(now)
        if self.leadership is None or self.leadership.state is not LeadershipState.LEADER:
            return  # suspended or over: the next event decides
        self._report_drained(self.leadership)
        self._acknowledge_pauses(self.leadership)
        self._expire_pauses(now)
        for index, p in enumerate(self.pipelines):
            if p.running or not p.status.restartable or p.status.state is PipelineState.DRAINED:
                continue
            name = p.config.name
            restarts = self._restarts.setdefault(name, _Restarts())
            if restarts.last_at is not None and now - restarts.last_at > RESTART_RESET_S:
                restarts.count = 0
            delay = restart_delay(restarts.count + 1)
            if restarts.failed_at is None:
                restarts.failed_at = now
                window = self._handover.window_s
                restarts.failures = [t for t in restarts.failures if now - t < window]
                restarts.failures.append(now)
                if self._hand_over_if_failing(p, len(restarts.failures)):
                    return
                self._log.warning(
                    "pipeline.restart_scheduled",
                    pipeline=name,
                    state=p.status.state,
                    error=p.status.error,
                    delay_s=delay,
                )
            if now - restarts.failed_at < delay:
                continue
            if not self._restart(index, restarts):
                return

    def _hand_over_if_failing(self, failed: PipelineLeader, failures: int) -> bool:
        """Leave the election for the policy's cool-down if `failed` failed on this node's
        disk or `failures` times in the window, and another node stands; True if it did."""
        name, status, policy = failed.config.name, failed.status, self._handover
        if status.local_fault:
            reason = f"pipeline {name} failed on this node's disk: {status.error}"
        elif failures >= policy.failures:
            reason = (
                f"pipeline {name} failed {failures} times in {policy.window_s:.0f} s, "
                f"last: {status.error}"
            )
        else:
            return False
        me = self._coordinator.node_id
        others = [n for n in self._coordinator.candidates(self.shard) if n != me]
        if not others:
            self._log.error("leader.no_one_to_hand_over_to", reason=reason)
            return False
        self._log.error(
            "leader.handing_over", reason=reason, candidates=others, cooldown_s=policy.cooldown_s
        )
        self._stop_pipelines(HANDOVER_GRACE_S, reason=reason)
        self._mark_elected(False)
        self.cooldown = Cooldown(time.monotonic() + policy.cooldown_s, reason)
        self._coordinator.leave(self.shard)
        self.standing = False
        return True

    def _set_draining(self, request: str | None) -> None:
        """Restart the term's pipelines in the mode a reshard wants (shard thread only). A
        suspended term restarts them when resumed."""
        if request != self._reshard:
            self._drained_reported = False  # another reshard: report to it
        self._reshard = request
        active = request is not None
        if active == self._draining:
            return
        self._draining = active
        self._log.info("reshard.draining" if active else "reshard.ended", request=request)
        leadership = self.leadership
        if self.pipelines and leadership is not None:
            self._stop_pipelines(HANDOVER_GRACE_S, reason="reshard")
            if leadership.state is LeadershipState.LEADER:
                self._start_pipelines()

    def _set_paused(self, names: frozenset[str]) -> None:
        """Stop the pipelines ops paused and start the ones they resumed (shard thread only).
        Outside a term, or in drain mode, only the set is kept: the next start applies it."""
        paused, resumed = names - self.paused, self.paused - names
        self.paused = names
        self._acknowledged &= names
        self._resumed = (self._resumed | resumed) - names
        for name in sorted(paused):
            self._log.warning("pipeline.paused_by_ops", pipeline=name)
        for name in sorted(resumed):
            self._log.info("pipeline.resumed_by_ops", pipeline=name)
        leadership = self.leadership
        if not self.leading or self._draining or leadership is None:
            return
        stopping = [p for p in self.pipelines if p.config.name in paused]
        self.pipelines = [p for p in self.pipelines if p.config.name not in paused]
        for p in stopping:
            clean = p.stop(self._grace)
            self._log.info(
                "pipeline.stopped_by_shard", pipeline=p.config.name, reason="paused", clean=clean
            )
        if leadership.state is LeadershipState.LEADER:  # suspended: Resumed starts them
            self._start_resumed(leadership)
            self._acknowledge_pauses(leadership)

    def _start_resumed(self, leadership: Leadership) -> None:
        """Start the pipelines ops resumed during this term."""
        for name in sorted(self._resumed):
            try:
                (pipeline,) = self._make_pipelines(leadership, name, False)
            except FencedError as exc:
                self._log.warning("leader.term_already_over", error=str(exc))
                return
            self._resumed.discard(name)
            self.pipelines.append(pipeline)
            pipeline.start()

    def _acknowledge_pauses(self, leadership: Leadership) -> None:
        """Record in each pause flag that its pipeline stopped in this term (once per term)."""
        if not self.leading or self._draining:
            return
        running = {p.config.name for p in self.pipelines}
        epoch, token = leadership.epoch, leadership.token
        if epoch is None or token is None:
            return
        held = HeldBy(self._coordinator.node_id, epoch, token)
        for name in sorted(self.paused - running - self._acknowledged):
            try:
                self._coordinator.pauses.acknowledge(self.shard, name, held)
            except CoordinationError as exc:  # retried at the next supervision
                self._log.warning("pipeline.pause_unacknowledged", pipeline=name, error=str(exc))
                return
            self._acknowledged.add(name)

    def _expire_pauses(self, now: float) -> None:
        """Resume every paused pipeline whose pause deadline passed (every PAUSE_CHECK_S);
        its flag's deletion comes back through the watch and starts it."""
        if not self.paused or now - self._pauses_checked < PAUSE_CHECK_S:
            return
        self._pauses_checked = now
        pauses = self._coordinator.pauses
        for name in sorted(self.paused):
            stored = pauses.read(self.shard, name)
            deadline = None if stored is None else stored.record.deadline
            if stored is None or deadline is None or time.time() < deadline:
                continue
            if pauses.resume_expired(self.shard, name, stored):
                self._log.error(
                    "pipeline.pause_expired",
                    pipeline=name,
                    by=stored.record.by,
                    reason=stored.record.reason,
                    deadline=deadline,
                    action="resumed: the command that paused it did not end it",
                )

    def _report_drained(self, leadership: Leadership) -> None:
        """Once every pipeline of a draining term is drained, report the shard drained."""
        if not self._draining or self._drained_reported or not self.pipelines:
            return
        if any(p.status.state is not PipelineState.DRAINED for p in self.pipelines):
            return
        epoch, token = leadership.epoch, leadership.token
        assert epoch is not None and token is not None
        info = DrainedInfo(self._coordinator.node_id, epoch, token)
        self._coordinator.reshard.mark_drained(self.shard, info)
        self._drained_reported = True

    def _report_stuck(self, now: float) -> None:
        """One `pipeline.stuck` event when a pipeline makes no progress for `stuck_after` (a hung
        thread, flushes failing, or a consumer paused with no flush committing), one
        `pipeline.unstuck` when it moves again."""
        for p in self.pipelines:
            name, stalled = p.config.name, p.stalled_for(now)
            if stalled >= self._stuck_after and name not in self._stuck:
                self._stuck.add(name)
                self._log.error(
                    "pipeline.stuck",
                    pipeline=name,
                    stalled_s=round(stalled, 1),
                    reason=p.stall_reason(now),
                    error=p.status.error,
                    hint="SIGUSR1 dumps every thread's stack to stderr",
                )
            elif stalled < self._stuck_after and name in self._stuck:
                self._stuck.discard(name)
                self._log.info("pipeline.unstuck", pipeline=name)

    def _restart(self, index: int, restarts: _Restarts) -> bool:
        """Replace the pipeline at `index` by a fresh one of the same term; False if the term
        is over (its loss event follows)."""
        assert self.leadership is not None
        failed = self.pipelines[index]
        failed.stop(0.0)
        try:
            (pipeline,) = self._make_pipelines(self.leadership, failed.config.name, self._draining)
        except FencedError as exc:
            self._log.warning("leader.term_already_over", error=str(exc))
            return False
        restarts.count += 1
        restarts.last_at, restarts.failed_at = time.monotonic(), None
        pipeline.status.restarts = failed.status.restarts + 1
        self.pipelines[index] = pipeline
        pipeline.start()
        self._log.info(
            "pipeline.restarted",
            pipeline=pipeline.config.name,
            attempt=restarts.count,
            after_error=failed.status.error,
        )
        self._announce(self.leadership)
        return True

    def _mark_elected(self, elected: bool) -> None:
        """Publish whether this node holds the shard's leadership; count each change."""
        labels = {"shard": str(self.shard)}
        if elected != self._elected:
            self._metrics.leader_changes.labels(**labels).inc()
        self._elected = elected
        self._metrics.leader.labels(**labels).set(1 if elected else 0)

    def _handle(self, event: LeadershipEvent) -> None:
        labels = {"shard": str(self.shard)}
        if isinstance(event, BecameLeader):
            self._log.info("leader.elected", epoch=event.epoch, token=event.token)
            self._mark_elected(True)
            self._metrics.epoch.labels(**labels).set(event.epoch)
            self._stop_pipelines(0.0, reason="new term")
            self._drained_reported = False
            self._start_pipelines()
        elif isinstance(event, Suspended):
            self._log.warning("leader.suspended")
            for p in self.pipelines:
                p.suspend()
        elif isinstance(event, Resumed):
            self._log.info("leader.resumed", epoch=event.epoch)
            for p in self.pipelines:
                p.resume()
            if not self.leading:  # a reshard switched modes while the term was suspended
                self._start_pipelines()
            elif self.leadership is not None:  # ops resumed pipelines while it was suspended
                self._start_resumed(self.leadership)
        elif isinstance(event, LostLeadership):
            self._log.warning("leader.lost", reason=event.reason)
            self._mark_elected(False)
            self._stop_pipelines(0.0, reason=event.reason)
        elif isinstance(event, FailoverRequested):
            began = time.monotonic()
            self._log.info("leader.failover_requested", to=event.request.to, by=event.request.by)
            self._stop_pipelines(HANDOVER_GRACE_S, reason="ops failover")
            self._mark_elected(False)
            if self.leadership is not None:
                self.leadership.resign("ops failover")
            self._log.info(
                "leader.handed_over",
                to=event.request.to,
                seconds=round(time.monotonic() - began, 3),
            )

    def _start_pipelines(self) -> None:
        assert self.leadership is not None
        if self._warm_up is not None:
            # A Spark session takes seconds to start: begin now, not at the first flush.
            threading.Thread(target=self._warm_up, name="spark-warm-up", daemon=True).start()
        try:
            pipelines = self._make_pipelines(self.leadership, None, self._draining)
        except FencedError as exc:  # the term ended before we got to it: its loss event follows
            self._log.warning("leader.term_already_over", error=str(exc))
            return
        self.leading_since = time.time()
        self.pipelines = [
            p for p in pipelines if self._draining or p.config.name not in self.paused
        ]
        # A new term restarts the delays; failures in the window still count towards a hand-over.
        self._restarts = {n: _Restarts(failures=r.failures) for n, r in self._restarts.items()}
        self._acknowledged, self._resumed = set(), set()
        for p in self.pipelines:
            p.start()
        self._announce(self.leadership)
        self._acknowledge_pauses(self.leadership)

    def _announce(self, leadership: Leadership) -> None:
        # Waiting here would hold back later events (a loss must stop pipelines at once).
        threading.Thread(
            target=self._announce_consuming,
            args=(leadership, list(self.pipelines)),
            name=f"announce-{self.shard}",
            daemon=True,
        ).start()

    def _announce_consuming(self, leadership: Leadership, pipelines: list[PipelineLeader]) -> None:
        """Publish `consuming` in the leader znode once every pipeline consumes."""
        began = time.monotonic()
        if not all(p.wait_consuming(RECOVERY_TIMEOUT_S) for p in pipelines):
            failed = {p.config.name: p.status.error for p in pipelines if p.status.error}
            if failed or any(p.status.state.live for p in pipelines):
                self._log.error(
                    "leader.recovery_failed",
                    seconds=round(time.monotonic() - began, 3),
                    errors=failed,
                )
            # Otherwise they were stopped (a hand-over, a lost term): that event is logged.
            return
        try:
            leadership.set_status("consuming")
        except Exception as exc:  # informative only: the CLI waits on it
            self._log.warning("leader.status_failed", error=repr(exc))
            return
        self._log.info("leader.consuming", seconds=round(time.monotonic() - began, 3))

    def _stop_pipelines(self, grace: float, reason: str) -> None:
        pipelines, self.pipelines = self.pipelines, []
        self.leading_since = None
        for p in pipelines:
            clean = p.stop(grace)
            self._log.info(
                "pipeline.stopped_by_shard", pipeline=p.config.name, reason=reason, clean=clean
            )
