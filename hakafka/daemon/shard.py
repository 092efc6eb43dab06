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

A pipeline ops paused (`hakafka pipeline pause`, `shards/<s>/paused/<pipeline>`, watched
here) does not run in any term: it stops (a flush in flight may finish within the grace), and
the leader records in the flag that it stopped in its term, which lets ops move its offsets or
drop its pending block; a pause whose deadline passed is resumed (`pause_expiry`). Resumed,
it starts like a new term's pipeline (recovery from checkpoint, pending intent and WAL). Drain
mode ignores pauses: a reshard needs every pipeline to commit what it holds, and a drained
pipeline consumes nothing anyway.

A pipeline that fails while the term holds is restarted within the term after a growing
delay, and a leader that keeps failing hands the shard over (`leader.handing_over`, or
`leader.no_one_to_hand_over_to` when it is the last candidate): see `restarts`.

What a term holds here (its pipelines, their restarts, which pauses it acknowledged, its
drained report) is one `Term`, made when the term's pipelines start and dropped when they
stop, so nothing of one term leaks into the next.
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
from hakafka.daemon.announce import announce_consuming
from hakafka.daemon.pause_expiry import PauseExpiry
from hakafka.daemon.restarts import (
    RESTART_BACKOFF,
    RESTART_RESET_S,
    Cooldown,
    HandoverPolicy,
    Restarts,
)
from hakafka.metrics import Metrics
from hakafka.pipeline import PipelineLeader, PipelineState

log = structlog.get_logger("hakafka.shard")

# An ops failover lets a flush in flight finish for this long, then abandons it: the flush is
# idempotent and its pending intent makes the next leader flush the same block again.
HANDOVER_GRACE_S = 0.5
SUPERVISE_EVERY_S = 0.5
DEFAULT_HANDOVER = HandoverPolicy()
_STOP = object()


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
class Term:
    """The pipelines this node runs for a term it leads, and what it keeps about them: made
    when they start (at election, again when a reshard switches their mode), dropped when
    they stop (the term lost, handed over or withdrawn, a mode switch, shutdown)."""

    since: float
    """Unix time the pipelines started."""
    pipelines: list[PipelineLeader]
    restarts: dict[str, Restarts] = field(default_factory=dict)
    """Per pipeline: its restarts in this term (the delays start over in each)."""
    acknowledged: set[str] = field(default_factory=set)
    """Paused pipelines whose flag records that they stopped in this term."""
    resumed: set[str] = field(default_factory=set)
    """Pipelines ops resumed that have not started yet (the term was suspended)."""
    drained_reported: bool = False
    """The reshard in progress has this term's drained report (`/reshard/<shard>`)."""


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
        handover: HandoverPolicy = DEFAULT_HANDOVER,
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
        self.term: Term | None = None
        """The term this node leads the shard in, while its pipelines run here."""
        # Per pipeline: monotonic times of its failures in the hand-over window, across terms.
        self._failures: dict[str, list[float]] = {}
        self._wanted = _Candidacy(stand=False, reason="not started")
        self.standing = False
        """True while this node is a candidate (or the leader) of the shard."""
        self._draining = False  # a reshard is in progress: pipelines drain, then hold
        self._reshard: str | None = None  # the id of that reshard
        self.cooldown: Cooldown | None = None
        """Set while this node stays out of the election after handing the shard over."""
        self.paused: frozenset[str] = frozenset()
        """The pipelines ops paused in this shard (they run in no term)."""
        self._log = log.bind(shard=shard)
        self._pause_expiry = PauseExpiry(coordinator.pauses, shard, self._log)
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
        return self.term is not None

    @property
    def token(self) -> int | None:
        """The fencing token of the term running here; None while none runs."""
        leadership = self.leadership
        return None if self.term is None or leadership is None else leadership.token

    @property
    def leading_since(self) -> float | None:
        """Unix time the term's pipelines started; None while no term runs here."""
        term = self.term
        return None if term is None else term.since

    @property
    def pipelines(self) -> list[PipelineLeader]:
        """The pipelines of the term running here ([] when none runs)."""
        term = self.term
        return [] if term is None else term.pipelines

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
        self._pause_expiry.check(self.paused, now)
        if (term := self.term) is None:
            return
        for index, p in enumerate(term.pipelines):
            if p.running or not p.status.restartable or p.status.state is PipelineState.DRAINED:
                continue
            name = p.config.name
            restarts = term.restarts.setdefault(name, Restarts())
            if restarts.last_at is not None and now - restarts.last_at > RESTART_RESET_S:
                restarts.count = 0
            delay = RESTART_BACKOFF.delay(restarts.count + 1)
            if restarts.failed_at is None:
                restarts.failed_at = now
                failures = self._handover.count(self._failures.setdefault(name, []), now)
                if self._hand_over_if_failing(p, failures):
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
            if not self._restart(term, index, restarts):
                return

    def _hand_over_if_failing(self, failed: PipelineLeader, failures: int) -> bool:
        """Leave the election for the policy's cool-down if `failed` failed on this node's
        disk or `failures` times in the window, and another node stands; True if it did."""
        policy = self._handover
        reason = policy.reason(failed.config.name, failed.status, failures)
        if reason is None:
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
        if request != self._reshard and self.term is not None:
            self.term.drained_reported = False  # another reshard: report to it
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
        for name in sorted(paused):
            self._log.warning("pipeline.paused_by_ops", pipeline=name)
        for name in sorted(resumed):
            self._log.info("pipeline.resumed_by_ops", pipeline=name)
        term, leadership = self.term, self.leadership
        if term is None or leadership is None:
            return
        term.acknowledged &= names
        term.resumed = (term.resumed | resumed) - names
        if self._draining:
            return
        stopping = [p for p in term.pipelines if p.config.name in paused]
        term.pipelines = [p for p in term.pipelines if p.config.name not in paused]
        for p in stopping:
            clean = p.stop(self._grace)
            self._log.info(
                "pipeline.stopped_by_shard", pipeline=p.config.name, reason="paused", clean=clean
            )
        if leadership.state is LeadershipState.LEADER:  # suspended: Resumed starts them
            self._start_resumed(leadership, term)
            self._acknowledge_pauses(leadership)

    def _start_resumed(self, leadership: Leadership, term: Term) -> None:
        """Start the pipelines ops resumed during `term`."""
        for name in sorted(term.resumed):
            try:
                (pipeline,) = self._make_pipelines(leadership, name, False)
            except FencedError as exc:
                self._log.warning("leader.term_already_over", error=str(exc))
                return
            term.resumed.discard(name)
            term.pipelines.append(pipeline)
            pipeline.start()

    def _acknowledge_pauses(self, leadership: Leadership) -> None:
        """Record in each pause flag that its pipeline stopped in this term (once per term)."""
        term = self.term
        if term is None or self._draining:
            return
        running = {p.config.name for p in term.pipelines}
        epoch, token = leadership.epoch, leadership.token
        if epoch is None or token is None:
            return
        held = HeldBy(self._coordinator.node_id, epoch, token)
        for name in sorted(self.paused - running - term.acknowledged):
            try:
                self._coordinator.pauses.acknowledge(self.shard, name, held)
            except CoordinationError as exc:  # retried at the next supervision
                self._log.warning("pipeline.pause_unacknowledged", pipeline=name, error=str(exc))
                return
            term.acknowledged.add(name)

    def _report_drained(self, leadership: Leadership) -> None:
        """Once every pipeline of a draining term is drained, report the shard drained."""
        term = self.term
        if not self._draining or term is None or term.drained_reported or not term.pipelines:
            return
        if any(p.status.state is not PipelineState.DRAINED for p in term.pipelines):
            return
        epoch, token = leadership.epoch, leadership.token
        assert epoch is not None and token is not None
        info = DrainedInfo(self._coordinator.node_id, epoch, token)
        self._coordinator.reshard.mark_drained(self.shard, info)
        term.drained_reported = True

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

    def _restart(self, term: Term, index: int, restarts: Restarts) -> bool:
        """Replace the pipeline at `index` by a fresh one of the same term; False if the term
        is over (its loss event follows)."""
        assert self.leadership is not None
        failed = term.pipelines[index]
        failed.stop(0.0)
        try:
            (pipeline,) = self._make_pipelines(self.leadership, failed.config.name, self._draining)
        except FencedError as exc:
            self._log.warning("leader.term_already_over", error=str(exc))
            return False
        restarts.count += 1
        restarts.last_at, restarts.failed_at = time.monotonic(), None
        pipeline.status.restarts = failed.status.restarts + 1
        term.pipelines[index] = pipeline
        pipeline.start()
        self._log.info(
            "pipeline.restarted",
            pipeline=pipeline.config.name,
            attempt=restarts.count,
            after_error=failed.status.error,
        )
        announce_consuming(self.shard, self.leadership, self.pipelines, self._log)
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
            self._start_pipelines()
        elif isinstance(event, Suspended):
            self._log.warning("leader.suspended")
            for p in self.pipelines:
                p.suspend()
        elif isinstance(event, Resumed):
            self._log.info("leader.resumed", epoch=event.epoch)
            for p in self.pipelines:
                p.resume()
            if self.term is None:  # a reshard switched modes while the term was suspended
                self._start_pipelines()
            elif self.leadership is not None:  # ops resumed pipelines while it was suspended
                self._start_resumed(self.leadership, self.term)
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
        """Begin a term here: its pipelines (all in drain mode during a reshard, else those
        not paused) made and started; none if the term is already over."""
        assert self.leadership is not None
        if self._warm_up is not None:
            # A Spark session takes seconds to start: begin now, not at the first flush.
            threading.Thread(target=self._warm_up, name="spark-warm-up", daemon=True).start()
        try:
            pipelines = self._make_pipelines(self.leadership, None, self._draining)
        except FencedError as exc:  # the term ended before we got to it: its loss event follows
            self._log.warning("leader.term_already_over", error=str(exc))
            return
        runs = [p for p in pipelines if self._draining or p.config.name not in self.paused]
        self.term = term = Term(time.time(), runs)
        for p in term.pipelines:
            p.start()
        announce_consuming(self.shard, self.leadership, self.pipelines, self._log)
        self._acknowledge_pauses(self.leadership)

    def _stop_pipelines(self, grace: float, reason: str) -> None:
        """End the term running here, if any: stop its pipelines, a flush in flight may finish
        within `grace` s."""
        term, self.term = self.term, None
        if term is None:
            return
        for p in term.pipelines:
            clean = p.stop(grace)
            self._log.info(
                "pipeline.stopped_by_shard", pipeline=p.config.name, reason=reason, clean=clean
            )
