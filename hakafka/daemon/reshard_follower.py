"""`ReshardFollower`: tells this node's shard runners when a reshard starts and ends.

While `/reshard` exists, every leader drains (see `hakafka/coordination/reshard.py`): its
pipelines commit all they hold, consume nothing, and the shard reports itself drained. When
`/reshard` goes (completed or aborted), leaders that still agree with the record consume
again; after a completed reshard the old layout's leaders differ from the new record, and the
`SettingsGuard` withdraws them.

A reshard past its deadline (`ReshardRequest.deadline`: the command's drain timeout plus a
grace) was left behind by a command that died; any node that follows it aborts it
(`reshard.expired`), so the cluster never stays drained with green health.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import structlog

from hakafka.coordination import CoordinationError, Coordinator, ReshardRequest
from hakafka.daemon.settings_guard import SettingsGuard
from hakafka.daemon.shard import ShardRunner

log = structlog.get_logger("hakafka.daemon")


class ReshardFollower:
    """Follows `/reshard` and passes its state to `runners` (main loop thread)."""

    def __init__(
        self, coordinator: Coordinator, guard: SettingsGuard, runners: Sequence[ShardRunner]
    ) -> None:
        self._coordinator = coordinator
        self._guard = guard
        self._runners = list(runners)
        self._changed = threading.Event()
        self._active: ReshardRequest | None = None  # the reshard in progress at the last poll

    def start(self) -> None:
        """Follow `/reshard` from now on (its current state is passed at the first poll)."""
        self._coordinator.reshard.watch(self._changed.set)

    def poll(self) -> None:
        """Pass the state of `/reshard` to the runners if it changed since the last poll; a
        failed read is retried at the next poll.

        When a reshard ends, the settings are compared first: a completed reshard recorded
        a layout this node's leaders may no longer agree with, and they must withdraw before
        they could consume again (the guard's withdrawal reaches each runner first)."""
        self._expire()
        if not self._changed.is_set():
            return
        self._changed.clear()
        try:
            request = self._coordinator.reshard.read()
            if request is None and self._active is not None:
                self._guard.check()
        except CoordinationError as exc:
            log.warning("reshard.read_failed", error=str(exc))
            self._changed.set()
            return
        self._active = request
        ident = None if request is None else f"{request.by}@{request.at}"
        for runner in self._runners:
            runner.reshard(ident)

    def _expire(self) -> None:
        """Abort the reshard in progress once it is past its deadline (its deletion comes
        back through the watch like any end of a reshard)."""
        request = self._active
        if request is None or time.time() < request.deadline:
            return
        try:
            aborted = self._coordinator.reshard.abort_expired(request)
        except CoordinationError as exc:  # tried again at the next poll
            log.warning("reshard.expire_failed", error=str(exc))
            return
        if aborted:
            log.error(
                "reshard.expired",
                by=request.by,
                at=request.at,
                deadline=request.deadline,
                action="aborted: the shards consume again in the old layout",
            )
