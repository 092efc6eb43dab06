"""`ReshardFollower`: tells this node's shard runners when a reshard starts and ends.

While `/reshard` exists, every leader drains (see `hakafka/coordination/reshard.py`): its
pipelines commit all they hold, consume nothing, and the shard reports itself drained. When
`/reshard` goes (completed or aborted), leaders that still agree with the record consume
again; after a completed reshard the old layout's leaders differ from the new record, and the
`SettingsGuard` withdraws them.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import structlog

from hakafka.coordination import CoordinationError, Coordinator
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
        self._active = False  # a reshard was in progress at the last poll

    def start(self) -> None:
        """Follow `/reshard` from now on (its current state is passed at the first poll)."""
        self._coordinator.reshard.watch(self._changed.set)

    def poll(self) -> None:
        """Pass the state of `/reshard` to the runners if it changed since the last poll; a
        failed read is retried at the next poll.

        When a reshard ends, the settings are compared first: a completed reshard recorded
        a layout this node's leaders may no longer agree with, and they must withdraw before
        they could consume again (the guard's withdrawal reaches each runner first)."""
        if not self._changed.is_set():
            return
        self._changed.clear()
        try:
            request = self._coordinator.reshard.read()
            if request is None and self._active:
                self._guard.check()
        except CoordinationError as exc:
            log.warning("reshard.read_failed", error=str(exc))
            self._changed.set()
            return
        self._active = request is not None
        ident = None if request is None else f"{request.by}@{request.at}"
        for runner in self._runners:
            runner.reshard(ident)
