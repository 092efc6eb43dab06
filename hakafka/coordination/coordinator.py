"""`Coordinator`: the daemon's one handle on ZooKeeper coordination.

It owns the session, the node registration (re-created after a new session), one
`Leadership` per joined shard, and fans connection state changes out to them: SUSPENDED
stops every leader's side effects at once, LOST drops leadership, CONNECTED resumes or
re-enters the elections.

Safety net: a reconciliation thread asks every `Leadership` to `reconcile` (on the worker)
every `RECONCILE_EVERY_S`, so a missed watch or an unknown outcome that nothing else
re-examines is corrected within seconds (see `election`).

Bound on SUSPENDED: kazoo declares the connection lost after 2/3 of the negotiated session
timeout without an answer, so a leader cut off from ZooKeeper stops side effects before the
ensemble can expire its session and elect a successor.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterable, Mapping

import structlog
from kazoo.client import KazooState
from kazoo.exceptions import NodeExistsError

from hakafka.coordination import balance, failover, paths
from hakafka.coordination.cluster_settings import SettingsStore
from hakafka.coordination.election import Leadership
from hakafka.coordination.errors import NodeIdTakenError, ZooKeeperUnavailableError
from hakafka.coordination.executor import SerialExecutor
from hakafka.coordination.leadership_events import Correction, LeadershipEvent
from hakafka.coordination.pause import PauseStore
from hakafka.coordination.records import (
    FailoverRequest,
    LeaderInfo,
    NodeInfo,
    PendingIntent,
    PinRecord,
    ReplacingInfo,
    encode_epoch,
)
from hakafka.coordination.registry import Registry
from hakafka.coordination.reshard import ReshardStore
from hakafka.coordination.session import ZkConfig, ZkSession
from retry_policy import Backoff, Waiter

log = structlog.get_logger("hakafka.coordination")

DEFAULT_FAILOVER_TIMEOUT_S = 30.0
RECONCILE_EVERY_S = 3.0
REGISTER_BACKOFF = Backoff(first=0.5, maximum=4.0)


class Coordinator:
    """ZooKeeper coordination for one node (`node_id`) of a hakafka cluster."""

    def __init__(
        self,
        config: ZkConfig,
        node_id: str,
        endpoints: NodeInfo,
        on_correction: Callable[[int, Correction], None] | None = None,
    ) -> None:
        """`on_correction(shard, action)` is called for every leadership state the
        read-back corrected (the daemon counts them in a metric)."""
        self.config = config
        self.node_id = paths.check_name("node", node_id)
        self.endpoints = endpoints
        self._session = ZkSession(config)
        self._registry = Registry(self._session)
        self.settings = SettingsStore(self._session)
        """The recorded shard-wide settings (`/settings`)."""
        self.reshard = ReshardStore(self._session)
        """The reshard in progress (`/reshard`) and the checkpoints it moves."""
        self.pauses = PauseStore(self._session)
        """Paused pipelines (`shards/<s>/paused/<pipeline>`) and the ops writes they allow."""
        self._worker = SerialExecutor(f"hakafka-zk-{node_id}")
        self._notifier = SerialExecutor(f"hakafka-zk-events-{node_id}")
        self._shards: dict[int, Leadership] = {}
        self._on_correction = on_correction
        self._registered = False
        self._registration_current = False  # confirmed since the last connection change
        self._id_taken = False
        self._started = False
        self._closing = threading.Event()
        self._reconciler = threading.Thread(
            target=self._reconcile_loop, name=f"hakafka-zk-reconcile-{node_id}", daemon=True
        )

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        """Connect (creating the root if missing); raises ZooKeeperUnavailableError on timeout."""
        self._session.add_listener(self._on_state)
        self._session.start()
        self._started = True
        self._reconciler.start()

    def close(self) -> None:
        """Leave every shard cleanly (when connected), end the session, stop the threads."""
        timeout = self.config.request_timeout_s
        self._closing.set()
        for shard in list(self._shards):
            if self._session.connected:
                try:
                    self.leave(shard)
                except Exception as exc:
                    log.warning("coordinator.leave_failed", shard=shard, error=repr(exc))
        for leadership in self._shards.values():
            leadership.cancel_timers()
        self._worker.stop(timeout)
        if self._started:
            self._session.close()
            self._started = False
        self._notifier.stop(timeout)

    def __enter__(self) -> Coordinator:
        self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _on_state(self, state: KazooState) -> None:
        # kazoo's connection thread: only flip flags and hand work to the worker.
        if state == KazooState.LOST and self._closing.is_set():
            # kazoo reports its own clean close as LOST: say what it is.
            log.info("zookeeper.closed", node=self.node_id)
        else:
            log.info("zookeeper.state", node=self.node_id, state=str(state))
        self._registration_current = False
        if state == KazooState.SUSPENDED:
            for leadership in list(self._shards.values()):
                leadership.session_suspended()
        elif state == KazooState.LOST:
            for leadership in list(self._shards.values()):
                leadership.session_lost()
        else:
            self._worker.submit(self._after_connect)

    def _after_connect(self) -> None:
        if not self._session.connected or not self._reregister():
            return
        for leadership in list(self._shards.values()):
            leadership.session_connected()

    def _reregister(self) -> bool:
        """Publish `nodes/<node_id>` again after a connection change (worker); False if
        another daemon took the id. A call that gets no answer is retried by the
        reconciliation thread; the elections go on meanwhile."""
        if not self._registered or self._registration_current:
            return not self._id_taken
        try:
            self._registry.register(self.node_id, self.endpoints)
        except NodeIdTakenError as exc:
            # Another daemon took this id while our session was gone: stand nowhere.
            self._id_taken = True
            log.error("registry.node_id_taken", node=self.node_id, error=str(exc))
            return False
        except ZooKeeperUnavailableError as exc:
            log.warning("registry.reregister_failed", node=self.node_id, error=str(exc))
            return True
        self._registration_current, self._id_taken = True, False
        return True

    def _reconcile_loop(self) -> None:
        while not self._closing.wait(RECONCILE_EVERY_S):
            if not self._session.connected or self._id_taken:
                continue  # CONNECTED re-evaluates everything; a taken id stands nowhere
            if not self._registration_current:
                self._worker.submit(self._reregister)
            for shard, leadership in list(self._shards.items()):
                if leadership.left:
                    self._shards.pop(shard, None)  # a leave finished by a retry
                else:
                    self._worker.submit(leadership.reconcile)

    @property
    def connected(self) -> bool:
        """True while the ZooKeeper session is connected."""
        return self._started and self._session.connected

    @property
    def session(self) -> ZkSession:
        """The ZooKeeper session this coordinator owns, for reading znodes and the session's
        id. Writes go through the coordinator, so they never race the election logic."""
        return self._session

    def settle(self, timeout_s: float) -> None:
        """Return once the coordination work queued before this call has run (such as each
        election's first evaluation after a `join`); TimeoutError after `timeout_s`."""
        self._call(lambda: None, timeout_s)

    # -- layout and registry ----------------------------------------------------------------

    def init_paths(self, shards: Iterable[int]) -> None:
        """Create the layout for `shards` if missing (idempotent; for `hakafka init`)."""
        self._call(lambda: self._init_paths(shards))

    def _init_paths(self, shards: Iterable[int]) -> None:
        for path in (paths.NODES, paths.REPLACING, paths.SHARDS):
            self._session.ensure(path)
        for shard in shards:
            for path in paths.shard_layout(shard):
                self._session.ensure(path)
            with contextlib.suppress(NodeExistsError):
                self._session.create(paths.epoch(shard), encode_epoch(0))

    def register(self) -> None:
        """Publish `nodes/<node_id>` with this node's endpoints (again after a new session).

        First the root's ACL is checked (`ZkSession.check_root_acl`: a warning, or
        OpenAclError under `require_acl`). NodeIdTakenError if another live session holds
        the node id (see `Registry.register`, which may wait for a previous session's end).

        A request that gets no answer (a slow or frozen server on a live connection) is
        asked again, backing off, for up to a session timeout from the first that did not:
        then ZooKeeperUnavailableError. A start-up must not die of a stall that the session
        itself outlives."""
        config = self.config
        waiter = Waiter(self._closing)
        silent_since: float | None = None
        attempt = 0
        while True:
            attempt += 1
            try:
                self._call(self._session.check_root_acl)
                # The wait for a previous session restarts at a reconnection (Registry.register).
                expiry_s = config.session_timeout_s + config.request_timeout_s
                self._call(self._register, 2 * expiry_s + 5 * config.request_timeout_s)
                return
            except (ZooKeeperUnavailableError, TimeoutError) as exc:
                now = time.monotonic()
                silent_since = now if silent_since is None else silent_since
                if now - silent_since >= config.session_timeout_s or self._closing.is_set():
                    raise
                delay = REGISTER_BACKOFF.delay(attempt)
                log.warning("registry.retrying", node=self.node_id, error=str(exc), retry_s=delay)
                waiter.sleep(delay)

    def _register(self) -> None:
        self._registry.register(self.node_id, self.endpoints)
        self._registered = self._registration_current = True

    def restrict_acl(self) -> int:
        """Restrict the root and everything under it to the auth user (`hakafka init`);
        returns how many znodes changed. ValueError without `auth`."""
        return self._session.restrict_acl()

    def nodes(self) -> dict[str, NodeInfo]:
        """Every registered node and its endpoints."""
        return self._registry.nodes()

    def mark_replacing(self, node: str, reason: str, by: str = "ops") -> ReplacingInfo:
        """Flag `node` as under replacement: it leaves every election (resigning where it
        leads) and `writable_replicas` stops reporting it."""
        return self._registry.mark_replacing(paths.check_name("node", node), reason, by)

    def clear_replacing(self, node: str) -> bool:
        """Make `node` eligible again; False if it was not flagged."""
        return self._registry.clear_replacing(paths.check_name("node", node))

    def replacing(self) -> dict[str, ReplacingInfo]:
        """Every node under replacement."""
        return self._registry.replacing()

    def writable_replicas(self, shard: int, replicas: Mapping[str, str]) -> dict[str, str]:
        """`replicas` (node -> ClickHouse endpoint of `shard`) minus the nodes under
        replacement, whose flags are read from ZooKeeper on every call: every node asking
        gets the same answer as soon as a flag is set or cleared.

        The map comes from the caller because it is config (`[clickhouse.replicas]`), not
        ZooKeeper state: `nodes/<node>` is ephemeral, so a replaced node whose daemon is down
        would drop out of an answer built from it instead of being reported not writable,
        and a crashed daemon would take a healthy ClickHouse out. `shard` is for the log."""
        writable = self._registry.writable_replicas(replicas)
        excluded = sorted(set(replicas) - set(writable))
        log.debug(
            "registry.writable_replicas", shard=shard, writable=sorted(writable), excluded=excluded
        )
        return writable

    # -- elections --------------------------------------------------------------------------

    def join(
        self, shard: int, on_change: Callable[[LeadershipEvent], None] | None = None
    ) -> Leadership:
        """Stand for leadership of `shard`; returns its `Leadership`. `on_change` is
        registered before the candidacy starts, so it sees every event."""
        leaving = self._shards.get(shard)
        if leaving is not None and leaving.left:
            self._shards.pop(shard, None)
        elif leaving is not None:
            if leaving.joined:
                raise ValueError(f"node {self.node_id} already stands in shard {shard}")
            self._call(lambda: leaving.rejoin(on_change))  # its leave is still being retried
            return leaving
        self._call(lambda: self._init_paths([shard]))
        leadership = Leadership(
            shard,
            self.node_id,
            session=self._session,
            registry=self._registry,
            worker=self._worker,
            notifier=self._notifier,
            on_correction=self._on_correction,
        )
        if on_change is not None:
            leadership.on_change(on_change)
        self._shards[shard] = leadership
        leadership.trigger()
        return leadership

    def leave(self, shard: int) -> None:
        """Stop standing for `shard` (resigning cleanly if leading). Returns once the leave
        is done or handed to the worker's retries: the shard is forgotten only when
        ZooKeeper confirmed it (a later `join` takes the candidacy back meanwhile)."""
        leadership = self._shards.get(shard)
        if leadership is None:
            return
        self._call(leadership.leave)
        if leadership.left:
            self._shards.pop(shard, None)

    def candidates(self, shard: int) -> list[str]:
        """The nodes standing in `shard`'s election, lowest sequence first, without the
        ones under replacement (who will not be elected)."""
        replacing = self._registry.replacing_names()
        nodes = []
        election = paths.election(shard)
        for name in sorted(self._session.children(election), key=paths.candidate_sequence):
            got = self._session.get(paths.candidate(shard, name))
            node = None if got is None else got[0].decode("utf-8", errors="replace")
            if node is not None and node not in replacing:
                nodes.append(node)
        return nodes

    def leader_of(self, shard: int) -> LeaderInfo | None:
        """The current leader of `shard`, or None while there is none."""
        got = self._session.get(paths.leader(shard))
        return None if got is None else LeaderInfo.decode(paths.leader(shard), got[0])

    def pending_intent(self, shard: int, pipeline: str) -> PendingIntent | None:
        """The flush intent of `pipeline` in `shard` (a block in doubt), or None."""
        path = paths.pending(shard, pipeline)
        got = self._session.get(path)
        return None if got is None else PendingIntent.decode(path, got[0])

    def request_failover(
        self,
        shard: int,
        to: str | None = None,
        by: str = "ops",
        timeout_s: float = DEFAULT_FAILOVER_TIMEOUT_S,
        token: int | None = None,
    ) -> FailoverRequest:
        """Ask `shard`'s leader to hand over, to node `to` if given (the others step aside
        until `to` leads or `timeout_s` passes); with `token`, only while the term of that
        fencing token lasts. Raises `FailoverRefused` with the reason."""
        return failover.request_failover(
            self._session, self._registry, shard, to=to, by=by, timeout_s=timeout_s, token=token
        )

    def registered_since(self) -> dict[str, float]:
        """Every registered node and since when (Unix time) its current registration exists:
        a node whose session expired and came back counts from its return."""
        return self._registry.registered_since()

    def pin_of(self, shard: int) -> PinRecord | None:
        """`shard`'s ops pin (`failover --hold`), expired or not; None if it has none."""
        return balance.read_pin(self._session, shard)

    def set_pin(self, shard: int, pin: PinRecord | None) -> None:
        """Hold `shard` on `pin.node` until `pin.until` (the balancer leaves it), or drop
        its pin (None)."""
        balance.write_pin(self._session, shard, pin)

    def _call(self, fn: Callable[[], object], timeout_s: float | None = None) -> None:
        """Run `fn` on the worker (so it never races the election logic) and wait for it, by
        default up to four request timeouts."""
        if self._worker.on_thread():
            fn()
            return
        self._worker.submit(fn).result(timeout=timeout_s or self.config.request_timeout_s * 4)
