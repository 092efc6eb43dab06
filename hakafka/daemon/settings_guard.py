"""`SettingsGuard`: this node stands for election only while its shard-wide settings agree
with the ones recorded in ZooKeeper (`/settings`, see `hakafka/drift.py`).

At start-up, before any shard stands, the guard records this node's settings if nothing is
recorded yet, or compares them with the record (adding this node's ClickHouse endpoints).
On a difference it logs `settings.drift` with every difference (key, both values, compatible
or not) and keeps every shard out of the election. It watches the record: when it changes
(`hakafka init --update` or `--replace`), the guard compares again, and a node that leads
with settings that no longer agree steps down (as for a hand-over), while a node that was
kept out stands as soon as the record agrees with it.

A drifting node stays up rather than exit with a `StartupError`: under systemd
(`Restart=always`) an exit would restart it in a loop, flooding the journal with start-ups
while `hakafka status` would only show the node as not running, without the reason. Up, it
stays registered and healthy (the watchdog is fed: nothing is broken in the process), its
`/status` carries `settings_drift` (which `hakafka status` shows for the node; null until the
first comparison), the journal has one `settings.drift` event per comparison, and the node
takes part again without a restart once the record changes to agree with it: configs can be
rolled out node by node, then recorded with `hakafka init --update`, and the new nodes take
over at once.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import structlog

from hakafka.config import Config
from hakafka.coordination import CoordinationError, Coordinator
from hakafka.daemon.shard import ShardRunner
from hakafka.drift import Difference, agree

log = structlog.get_logger("hakafka.daemon")

DRIFT_REASON = "shard-wide settings differ from the recorded ones"


class SettingsGuard:
    """Stands `runners` while `config` agrees with the recorded shard-wide settings, and
    withdraws them while it does not."""

    def __init__(
        self, coordinator: Coordinator, config: Config, runners: Sequence[ShardRunner]
    ) -> None:
        self._coordinator = coordinator
        self._config = config
        self._runners = list(runners)
        self._changed = threading.Event()
        self.drift: tuple[Difference, ...] | None = None
        """The differences that keep this node out of every election (empty: it stands; None:
        not compared yet, during start-up)."""

    def start(self) -> None:
        """Compare once and stand or withdraw accordingly, then follow the record. Raises a
        `CoordinationError` when ZooKeeper cannot be read (the daemon does not start)."""
        self.check()
        self._coordinator.settings.watch(self._changed.set)

    def poll(self) -> None:
        """Compare again if the record changed since the last comparison (main loop). A
        failed comparison changes nothing and is retried at the next poll."""
        if not self._changed.is_set():
            return
        self._changed.clear()
        try:
            self.check()
        except CoordinationError as exc:
            log.warning("settings.check_failed", node=self._config.node, error=str(exc))
            self._changed.set()

    def check(self) -> None:
        """Compare with the record now; withdraw every shard on a difference, else stand."""
        agreement = agree(self._coordinator.settings, self._config)
        if agreement.refused:
            log.error(
                "settings.drift",
                node=self._config.node,
                differences=[str(d) for d in agreement.differences],
                hint="this node stands in no shard until its config agrees with the record "
                "(`hakafka config check --cluster` shows the differences)",
            )
            self.drift = agreement.differences
            for runner in self._runners:
                runner.withdraw(DRIFT_REASON)
            return
        if self.drift:
            log.info("settings.agreed", node=self._config.node)
        self.drift = ()
        for runner in self._runners:
            runner.stand()
