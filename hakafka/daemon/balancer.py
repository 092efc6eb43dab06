"""`Balancer`: hands a shard this node leads beyond its share to a co-replica that leads
fewer, one at a time, through the ops failover path (thread `balance`).

The decision is `coordination.balance.plan_move`; this thread reads its view every
`[balance] interval` (with jitter, so that the nodes of a fleet do not look at once) and
requests the hand-over. The shard's own term then finishes or abandons its flush and resigns,
as for `hakafka failover --to`. A node that leads nothing reads nothing.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable

import structlog

from hakafka.config import Config
from hakafka.coordination import Coordinator, FailoverRefused, ZooKeeperUnavailableError
from hakafka.coordination.balance import (
    FleetView,
    Move,
    eligible_nodes,
    leads_of,
    over_share,
    plan_move,
    read_shards,
)

log = structlog.get_logger("hakafka.daemon")

JITTER = 0.2  # each wait is the interval times 1 +- this
# How long the other candidates step aside for the target (a hand-over takes 1-2 s; they
# stop stepping aside at once if the target's candidate goes away).
HANDOVER_TIMEOUT_S = 10.0


class Balancer:
    """Moves one shard per look while this node leads more than its share (see the module
    docstring). `leading()` maps the shards this node leads now to their fencing tokens;
    `on_move` is told of each requested move (a metric)."""

    def __init__(
        self,
        coordinator: Coordinator,
        config: Config,
        leading: Callable[[], dict[int, int]],
        *,
        on_move: Callable[[Move], None] = lambda _move: None,
        rng: random.Random | None = None,
    ) -> None:
        """Balances the shards of `config` (its `[balance]`, node, shards and shard count)."""
        self._coordinator, self._node = coordinator, config.node
        self._shards, self._shard_count = list(config.shards), config.shard_count
        self._config, self._leading, self._on_move = config.balance, leading, on_move
        self._rng = rng or random.Random()
        self._known: dict[str, str] = {}  # candidate znode -> node, of this node's shards
        self._known_all: dict[str, str] = {}  # the same, of every shard (read when over share)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="balance", daemon=True)

    def start(self) -> None:
        if self._config.enabled:
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join(timeout=5.0)  # a look is a few reads: each bounded

    def step(self) -> Move | None:
        """Look once; request and return the move made (None: none was due)."""
        tokens = self._leading()
        if not tokens:
            return None
        session, now = self._coordinator.session, time.time()
        settle = self._config.settle
        eligible = eligible_nodes(
            self._node,
            self._coordinator.registered_since(),
            self._coordinator.replacing(),
            now=now,
            settle_s=settle,
        )
        mine = read_shards(session, self._shards, eligible, self._known, now=now)
        if not over_share(self._node, mine):
            return None
        everyone = read_shards(
            session, range(self._shard_count), eligible, self._known_all, now=now, pins=False
        )
        view = FleetView(mine, leads_of(everyone), everyone)
        move = plan_move(self._node, view, now=now, settle_s=settle)
        if move is None or move.shard not in tokens:
            return None
        try:
            self._coordinator.request_failover(
                move.shard,
                to=move.target,
                by=f"balance:{self._node}",
                timeout_s=HANDOVER_TIMEOUT_S,
                token=tokens[move.shard],
            )
        except FailoverRefused as exc:  # pending, the target just left, or the term ended
            log.info("balance.move_refused", shard=move.shard, to=move.target, reason=str(exc))
            return None
        except ZooKeeperUnavailableError as exc:  # it may have been made: the next look sees
            log.warning("balance.move_unknown", shard=move.shard, to=move.target, error=str(exc))
            return None
        log.info("balance.move", shard=move.shard, to=move.target, why=move.why())
        self._on_move(move)
        return move

    def _run(self) -> None:
        interval = self._config.interval
        while not self._stop.wait(interval * self._rng.uniform(1 - JITTER, 1 + JITTER)):
            try:
                self.step()
            except ZooKeeperUnavailableError as exc:  # the next look reads again
                log.warning("balance.read_failed", error=str(exc))
            except Exception as exc:  # a bug here must not end balancing for good
                log.error("balance.failed", error=repr(exc))
