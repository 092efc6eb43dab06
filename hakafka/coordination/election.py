"""One shard's candidacy and leadership: the `Leadership` state object the daemon waits on.

Mechanics (docs/DESIGN.md, "ZooKeeper layout", with the rules for unknown outcomes): every
joined node keeps an ephemeral sequential candidate `shards/<s>/election/n_…` holding its
node id. The leader is the lowest candidate whose node is eligible (not under replacement,
and the failover target while a `failover --to` request is active and the target stands).
The winner bumps `epoch` and creates the ephemeral `leader` znode in one multi-op, so a
leader is only published once the previous `leader` znode is gone, and the new `epoch`
version is the fencing token. All ZooKeeper work happens on the coordinator's serial
worker, driven by watches; kazoo's threads only hand work over.

Leadership is read back, never remembered: a call whose outcome is unknown (its reply lost,
or no answer within the request timeout) may have been applied, so the next evaluation
adopts or deletes a `leader` of this session, deletes a stray candidate of this session, and
retries a resignation or leave (`_resigning`) until ZooKeeper confirms it. A suspended
leader re-checks on a timer and drops after a session timeout. `reconcile` (every few
seconds) runs the same checks as a safety net; each correction is logged
(`election.corrected`) and counted through `on_correction`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import structlog
from kazoo.protocol.states import EventType, ZnodeStat

from hakafka.coordination import paths
from hakafka.coordination.errors import CoordinationError, FencedError, ZooKeeperUnavailableError
from hakafka.coordination.executor import SerialExecutor
from hakafka.coordination.failover import read_request
from hakafka.coordination.fenced import FencedState
from hakafka.coordination.leadership_events import (
    BecameLeader,
    Correction,
    FailoverRequested,
    LeadershipEvent,
    LeadershipState,
    LostLeadership,
    Resumed,
    Suspended,
)
from hakafka.coordination.records import FailoverRequest, LeaderInfo, decode_epoch, encode_epoch
from hakafka.coordination.registry import Registry
from hakafka.coordination.session import ZkSession

log = structlog.get_logger("hakafka.coordination")

RETRY_DELAY_S = 0.5


class Leadership:
    """The candidacy of this node in one shard, and its leadership while it has it.

    Public: `state`, `epoch`, `token`, `wait_leader`, `on_change`, `resign`, `set_status`,
    `failover_requested` and `fenced`. Callbacks run on the coordinator's notifier thread,
    in order; they may block briefly but must not wait for the election itself.
    """

    def __init__(
        self,
        shard: int,
        node_id: str,
        *,
        session: ZkSession,
        registry: Registry,
        worker: SerialExecutor,
        notifier: SerialExecutor,
        on_correction: Callable[[int, Correction], None] | None = None,
    ) -> None:
        self.shard = shard
        self.node_id = node_id
        self._log = log.bind(shard=shard, node=node_id)
        self._session = session
        self._registry = registry
        self._worker = worker
        self._notifier = notifier
        self._cond = threading.Condition()
        self._state = LeadershipState.FOLLOWER
        self._epoch: int | None = None
        self._token: int | None = None
        self._epoch_mzxid = 0
        self._status = "elected"
        self._joined = True
        self._candidate: str | None = None
        self._candidate_nodes: dict[str, tuple[str, int]] = {}  # name -> (node, owner session)
        self._resigning: str | None = None  # why, while a resignation is not yet confirmed
        self._suspended_at: float | None = None  # monotonic time the current suspension began
        self._on_correction = on_correction
        self._callbacks: list[Callable[[LeadershipEvent], None]] = []
        self._timers: list[threading.Timer] = []
        self._deadline_armed: float | None = None
        self.failover_requested = threading.Event()
        """Set while an ops failover request waits for this leader to resign."""

    # -- public API -------------------------------------------------------------------------

    @property
    def state(self) -> LeadershipState:
        with self._cond:
            return self._state

    @property
    def epoch(self) -> int | None:
        """The epoch number while leading (or suspended), else None."""
        with self._cond:
            return self._epoch

    @property
    def token(self) -> int | None:
        """The fencing token (the `epoch` znode's version) while leading, else None."""
        with self._cond:
            return self._token

    @property
    def joined(self) -> bool:
        """True while the node stands in this shard (from `join` until `leave`)."""
        return self._joined

    @property
    def left(self) -> bool:
        """True once a `leave` is done: nothing of this node's candidacy is left in ZooKeeper."""
        with self._cond:
            following = self._state is LeadershipState.FOLLOWER
        return following and not self._joined and self._candidate is None and not self._resigning

    def wait_leader(self, timeout: float) -> bool:
        """Wait up to `timeout` s until this node leads the shard; True if it does."""
        with self._cond:
            return self._cond.wait_for(lambda: self._state is LeadershipState.LEADER, timeout)

    def on_change(self, callback: Callable[[LeadershipEvent], None]) -> None:
        """Call `callback(event)` for every later leadership event."""
        with self._cond:
            self._callbacks.append(callback)

    def resign(self, reason: str, timeout: float | None = None) -> None:
        """Give up leadership cleanly (leader and candidate znodes deleted in one multi-op,
        together with an honoured failover request), then stand again as the newest
        candidate. Returns when done; a no-op when not leading."""
        self._run(lambda: self._resign(reason), timeout)

    def set_status(self, status: str, timeout: float | None = None) -> None:
        """Publish `status` (e.g. "recovering", "consuming") in the `leader` znode."""
        self._run(lambda: self._set_status(status), timeout)

    def fenced(self) -> FencedState:
        """Checkpoint/pending access bound to the current fencing token.

        Raises `FencedError` when this node is not leading right now."""
        with self._cond:
            if self._state is not LeadershipState.LEADER or self._token is None:
                raise FencedError(
                    f"shard {self.shard}: node {self.node_id} is not the leader "
                    f"(state {self._state.value})"
                )
            epoch, token = self._epoch or 0, self._token
        return FencedState(self._session, self.shard, epoch, token, lambda: self._leads_with(token))

    # -- called by the coordinator ----------------------------------------------------------

    def trigger(self, _event: Any = None) -> None:
        """Watch callback: re-evaluate on the worker (kazoo thread: must not block)."""
        if _event is not None and getattr(_event, "type", None) == EventType.NONE:
            return  # connection-state pseudo event; CONNECTED re-evaluates everything
        self._worker.submit(self._evaluate)

    def session_suspended(self) -> None:
        """The connection dropped (kazoo thread): a leader stops side effects at once."""
        with self._cond:
            if self._state is not LeadershipState.LEADER:
                return
            self._state = LeadershipState.SUSPENDED
            self._suspended_at = time.monotonic()
        self._log.warning("election.suspended")
        self._notify(Suspended())

    def session_lost(self) -> None:
        """The session expired or closed (kazoo thread): its ephemerals are gone."""
        with self._cond:
            self._candidate = None
            self._resigning = None  # the session's end deleted whatever it still owned
        self._drop("zookeeper session lost")

    def session_connected(self) -> None:
        """The connection is back (worker): resume if the epoch is still ours, then
        re-evaluate (watches were reset by the disconnection)."""
        self._evaluate()

    def leave(self) -> None:
        """Stop standing in this shard (worker): resign if leading, delete the candidate.
        What ZooKeeper does not confirm is retried on the worker until `left` is True."""
        self._joined = False
        try:
            self._resign("node left the shard")
        except ZooKeeperUnavailableError as exc:  # deleting the candidate: evaluated again
            self._log.warning("election.leave_unconfirmed", error=str(exc))
            self._retry_later()

    def rejoin(self, callback: Callable[[LeadershipEvent], None] | None) -> None:
        """Stand again after a `leave` that is not complete yet (worker); `callback`
        replaces the callbacks given before."""
        with self._cond:
            self._callbacks = [] if callback is None else [callback]
        self._joined = True
        self._evaluate()

    def reconcile(self) -> None:
        """The safety net (worker, every few seconds): finish a pending resignation, resume
        or drop a suspended term, check that a leader's `leader` and `epoch` are still its
        own, and evaluate the election again (which adopts or deletes a `leader` owned by
        this session while it follows)."""
        if not self._session.connected:
            return
        try:
            if self.state is LeadershipState.LEADER and not self._still_leads():
                self._correct(Correction.DROPPED_LEADERSHIP)
                self._drop("leader znode or epoch no longer this term's")
            self._evaluate_once()
        except ZooKeeperUnavailableError as exc:
            self._log.warning("election.reconcile_failed", error=str(exc))

    def cancel_timers(self) -> None:
        for timer in self._timers:
            timer.cancel()
        self._timers = []

    # -- worker-side logic ------------------------------------------------------------------

    def _run(self, fn: Callable[[], None], timeout: float | None) -> None:
        if self._worker.on_thread():
            fn()
            return
        wait = timeout if timeout is not None else self._session.config.request_timeout_s * 4
        self._worker.submit(fn).result(timeout=wait)

    def _leads_with(self, token: int) -> bool:
        with self._cond:
            return self._state is LeadershipState.LEADER and self._token == token

    def _notify(self, event: LeadershipEvent) -> None:
        with self._cond:
            callbacks = list(self._callbacks)
            self._cond.notify_all()
        for callback in callbacks:
            self._notifier.submit(lambda cb=callback: cb(event))  # type: ignore[misc]

    def _drop(self, reason: str) -> bool:
        """Move to FOLLOWER; emits LostLeadership if we were leading. True if we were."""
        with self._cond:
            was = self._state is not LeadershipState.FOLLOWER
            self._state = LeadershipState.FOLLOWER
            self._epoch = None
            self._token = None
            self.failover_requested.clear()
        if was:
            self._log.warning("election.lost", reason=reason)
            self._notify(LostLeadership(reason))
        return was

    def _correct(self, action: Correction, **fields: object) -> None:
        self._log.warning("election.corrected", action=action, **fields)
        if self._on_correction is not None:
            self._on_correction(self.shard, action)

    def _owns(self, stat: ZnodeStat | None) -> bool:
        return stat is not None and stat.ephemeralOwner == self._session.session_id

    def _still_leads(self) -> bool:
        """ZooKeeper says this term holds: `leader` is this session's and `epoch` has our
        token as its version."""
        leader = self._session.exists(paths.leader(self.shard))
        epoch = self._session.exists(paths.epoch(self.shard))
        return self._owns(leader) and epoch is not None and epoch.version == self.token

    def _retry_later(self, delay: float = RETRY_DELAY_S) -> None:
        self._timers = [t for t in self._timers if t.is_alive()]
        timer = threading.Timer(delay, self.trigger)
        timer.daemon = True
        self._timers.append(timer)
        timer.start()

    def _evaluate(self) -> None:
        try:
            self._evaluate_once()
        except ZooKeeperUnavailableError as exc:
            self._log.warning("election.evaluate_failed", error=str(exc))
            if self._session.connected:
                self._retry_later()

    def _evaluate_once(self) -> None:
        if not self._session.connected:
            return
        if self.state is LeadershipState.SUSPENDED:
            self._resume_or_drop()
            if self.state is LeadershipState.SUSPENDED:
                return
        if self._resigning is not None and not self._finish_resign():
            return
        replacing = self._registry.replacing_names(self.trigger)
        found = read_request(self._session, self.shard, self.trigger)
        request, request_stat = found if found is not None else (None, None)
        now = time.time()
        target = None
        if request is not None and request.to is not None and now < request.deadline:
            target = request.to
            if self._deadline_armed != request.deadline:
                self._deadline_armed = request.deadline
                self._retry_later(request.deadline - now + 0.05)
        if target is not None and target != self.node_id and not self._stands(target):
            target = None  # it died or left the shard: nobody steps aside for it any more
        if self.state is LeadershipState.LEADER:
            if self.node_id in replacing:
                self._resign("node is under replacement")
            elif request is not None and request_stat is not None:
                self._leader_handle_request(request, request_stat, now)
            return
        leader_path = paths.leader(self.shard)
        if not self._joined or self.node_id in replacing or target not in (None, self.node_id):
            self._delete_own_leader(self._session.exists(leader_path), "node must not lead")
            self._withdraw()
            return
        if self._candidate is None:
            created = self._session.create(
                paths.candidate_prefix(self.shard),
                self.node_id.encode(),
                ephemeral=True,
                sequence=True,
            )
            self._candidate = created.rsplit("/", 1)[1]
            self._log.info("election.candidate", candidate=self._candidate)
        winner = self._winner(replacing, target)
        if winner is None or winner != self._candidate:
            leader = self._session.exists(leader_path, self.trigger)
            self._delete_own_leader(leader, f"candidate {winner} comes first")
            return
        self._try_lead(request, request_stat)

    def _delete_own_leader(self, leader: ZnodeStat | None, why: str) -> None:
        """Delete `leader` if this session owns it although this node follows."""
        if self._owns(leader):
            assert leader is not None
            self._session.delete(paths.leader(self.shard), leader.version)
            self._correct(Correction.DELETED_LEADER, why=why)

    def _winner(self, replacing: set[str], target: str | None) -> str | None:
        """The lowest eligible candidate's name (sets a watch on the candidates): not under
        replacement, and the failover `target` while one stands."""
        election = paths.election(self.shard)
        names = sorted(self._session.children(election, self.trigger), key=paths.candidate_sequence)
        if self._candidate not in names:
            # Our candidate vanished although the session lives (deleted by hand): stand again.
            self._candidate = None
            self._retry_later(0.0)
            return None
        self._candidate_nodes = {n: v for n, v in self._candidate_nodes.items() if n in names}
        standing: list[tuple[str, str]] = []  # (candidate, node) of the eligible, lowest first
        for name in names:
            known = self._candidate_of(name)
            if known is None:
                continue
            node, owner = known
            if owner == self._session.session_id and name != self._candidate:
                # A create whose reply was lost: ours, but not the candidate we stand with.
                self._session.delete(paths.candidate(self.shard, name))
                self._correct(Correction.DELETED_CANDIDATE, candidate=name)
                continue
            if node not in replacing:
                standing.append((name, node))
        return next((name for name, node in standing if target in (None, node)), None)

    def _stands(self, node: str) -> bool:
        """Whether `node` has a candidate in this shard's election (watched: a candidate that
        goes away evaluates again)."""
        for name in self._session.children(paths.election(self.shard), self.trigger):
            known = self._candidate_of(name)
            if known is not None and known[0] == node:
                return True
        return False

    def _candidate_of(self, name: str) -> tuple[str, int] | None:
        """Candidate `name`'s node and owner session (read once, then cached: a name is never
        reused); None if it is gone."""
        known = self._candidate_nodes.get(name)
        if known is None:
            got = self._session.get(paths.candidate(self.shard, name))
            if got is None:
                return None
            known = got[0].decode("utf-8", errors="replace"), got[1].ephemeralOwner
            self._candidate_nodes[name] = known
        return known

    def _try_lead(self, request: FailoverRequest | None, request_stat: ZnodeStat | None) -> None:
        leader_path = paths.leader(self.shard)
        leader = self._session.exists(leader_path, self.trigger)
        if self._owns(leader):
            self._adopt(request, request_stat)
            return
        if leader is not None:
            return  # the previous leader's znode is still there: its deletion triggers us
        epoch_path = paths.epoch(self.shard)
        got = self._session.get(epoch_path)
        if got is None:
            raise CoordinationError(f"{epoch_path} is missing: run `hakafka init` (init_paths)")
        new_epoch = decode_epoch(epoch_path, got[0]) + 1
        info = LeaderInfo(node=self.node_id, epoch=new_epoch, since=time.time())
        txn = self._session.transaction()
        txn.set_data(epoch_path, encode_epoch(new_epoch), version=got[1].version)
        txn.create(leader_path, info.encode(), ephemeral=True)
        results = self._session.commit(txn, leader_path)
        if any(isinstance(r, Exception) for r in results):
            self._log.info("election.lead_race", errors=[repr(r) for r in results])
            self._retry_later()
            return
        self._become_leader(new_epoch, results[0], info.status, request, request_stat)

    def _adopt(self, request: FailoverRequest | None, request_stat: ZnodeStat | None) -> None:
        """`leader` is this session's while this node follows: the election multi-op went
        through although its reply was lost. Take the term if its epoch is still the shard's
        (nobody can have been elected since: the znode blocked them), else delete it."""
        leader_path, epoch_path = paths.leader(self.shard), paths.epoch(self.shard)
        leader = self._session.get(leader_path)
        epoch = self._session.get(epoch_path)
        if leader is None or not self._owns(leader[1]) or epoch is None:
            self._retry_later()  # it changed under us: evaluate again
            return
        info = LeaderInfo.decode(leader_path, leader[0])
        number = decode_epoch(epoch_path, epoch[0])
        if info.node != self.node_id or info.epoch != number:
            self._delete_own_leader(leader[1], f"its epoch {info.epoch} is not {number}")
            self._retry_later(0.0)
            return
        self._correct(Correction.ADOPTED_LEADER, epoch=number)
        self._become_leader(number, epoch[1], info.status, request, request_stat)

    def _become_leader(
        self,
        epoch: int,
        epoch_stat: ZnodeStat,
        status: str,
        request: FailoverRequest | None,
        request_stat: ZnodeStat | None,
    ) -> None:
        with self._cond:
            self._state = LeadershipState.LEADER
            self._epoch = epoch
            self._token = epoch_stat.version
            self._epoch_mzxid = epoch_stat.mzxid
            self._status = status
            self.failover_requested.clear()
        self._log.info("election.became_leader", epoch=epoch, token=epoch_stat.version)
        self._notify(BecameLeader(epoch, epoch_stat.version))
        if request is not None and request_stat is not None:
            self._leader_handle_request(request, request_stat, time.time())

    def _leader_handle_request(self, request: FailoverRequest, stat: ZnodeStat, now: float) -> None:
        """As leader: delete a request that is honoured, stale or expired; otherwise tell the
        daemon (it finishes or abandons its flush and resigns)."""
        path = paths.failover(self.shard)
        if request.to == self.node_id:
            outcome = "honoured"
        elif stat.czxid < self._epoch_mzxid:
            outcome = "predates_leader"  # leadership moved since it was made
        elif request.to is not None and now >= request.deadline:
            outcome = "expired"
        else:
            if not self.failover_requested.is_set():
                self.failover_requested.set()
                self._log.info("failover.requested_of_leader", to=request.to)
                self._notify(FailoverRequested(request))
            return
        self._session.delete(path, stat.version)
        self._log.info("failover.done", outcome=outcome, to=request.to)

    def _withdraw(self) -> None:
        if self._candidate is not None:
            self._session.delete(paths.candidate(self.shard, self._candidate))
            self._log.info("election.withdrew")
            self._candidate = None

    def _resign(self, reason: str) -> None:
        if self.state is LeadershipState.FOLLOWER and self._resigning is None:
            self._withdraw()
            if self._joined:
                self._evaluate()
            return
        # Stop side effects before the successor can be elected.
        self._drop(f"resigned: {reason}")
        self._resigning = self._resigning or reason
        try:
            done = self._finish_resign()
        except ZooKeeperUnavailableError as exc:
            self._log.warning("election.resign_unconfirmed", error=str(exc))
            self._retry_later()
            return
        if done and self._joined:
            self._evaluate()

    def _finish_resign(self) -> bool:
        """Delete what this session still owns of the term (`leader`, with a failover request
        it honours) and its candidate, in one multi-op; True once ZooKeeper confirms it.
        Every attempt reads first, so a retry after an unknown outcome deletes only what is
        still there. Not confirmed: retried later (a lost connection raises, and the next
        CONNECTED evaluates again)."""
        reason = self._resigning
        txn = self._session.transaction()
        ops: list[str] = []
        leader_path = paths.leader(self.shard)
        leader = self._session.exists(leader_path)
        if self._owns(leader):
            assert leader is not None
            txn.delete(leader_path, leader.version)
            ops.append("leader")
            found = read_request(self._session, self.shard)
            if found is not None and found[0].to is None:
                # Honoured by this resignation; a successor would drop it too (it predates them).
                txn.delete(paths.failover(self.shard), found[1].version)
                ops.append("failover")
        if self._candidate is not None:
            candidate = paths.candidate(self.shard, self._candidate)
            if self._session.exists(candidate) is not None:
                txn.delete(candidate)
                ops.append("candidate")
        results = self._session.commit(txn, leader_path) if ops else []
        errors = [repr(r) for r in results if isinstance(r, Exception)]
        if errors:
            self._log.info("election.resign_retry", reason=reason, errors=errors)
            self._retry_later()
            return False
        self._candidate, self._resigning = None, None
        self._log.info("election.resigned", reason=reason, deleted=ops)
        return True

    def _resume_or_drop(self) -> None:
        """A suspended term on a connection that is back: resume it if ZooKeeper confirms it
        is still ours, drop it if not. A check that times out (a slow or frozen server on a
        live connection: no CONNECTED will follow) is retried on a timer; past a session
        timeout of suspension the term is dropped, and the next evaluation adopts or deletes
        the `leader` znode once ZooKeeper answers."""
        try:
            ours = self._still_leads()
        except ZooKeeperUnavailableError as exc:
            began = self._suspended_at or time.monotonic()
            suspended_s = time.monotonic() - began
            self._log.warning(
                "election.resume_check_failed", error=str(exc), suspended_s=round(suspended_s, 1)
            )
            if suspended_s >= self._session.config.session_timeout_s:
                self._correct(Correction.DROPPED_SUSPENDED, suspended_s=round(suspended_s, 1))
                self._drop(f"suspended for {suspended_s:.1f} s without ZooKeeper confirming it")
            if self._session.connected:
                self._retry_later()
            return
        if not ours:
            self._drop("leadership lost while the connection was suspended")
            return
        with self._cond:
            self._state = LeadershipState.LEADER
            epoch_no, token = self._epoch or 0, self._token or 0
        self._log.info("election.resumed", epoch=epoch_no)
        self._notify(Resumed(epoch_no, token))

    def _set_status(self, status: str) -> None:
        with self._cond:
            if self._state is not LeadershipState.LEADER or self._epoch is None:
                raise FencedError(f"shard {self.shard}: set_status({status!r}): not the leader")
            info = LeaderInfo(
                node=self.node_id, epoch=self._epoch, since=time.time(), status=status
            )
        path = paths.leader(self.shard)
        got = self._session.get(path)
        if got is None or got[1].ephemeralOwner != self._session.session_id:
            raise FencedError(f"shard {self.shard}: set_status({status!r}): {path} is not ours")
        since = LeaderInfo.decode(path, got[0]).since
        info = LeaderInfo(node=info.node, epoch=info.epoch, since=since, status=status)
        self._session.set(path, info.encode(), got[1].version)
