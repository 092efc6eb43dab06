"""The recorded shard-wide settings (`/settings`): read, create once, replace by version, watch.

Whoever records first wins (`create` is atomic); everyone else compares with what is
recorded. Changes are version-checked, so two writers that read the same record cannot both
replace it: the loser reads again and compares again.
"""

from __future__ import annotations

from collections.abc import Callable

import structlog
from kazoo.exceptions import BadVersionError, NodeExistsError
from kazoo.protocol.states import ZnodeStat
from kazoo.recipe.watchers import DataWatch

from hakafka.coordination import paths
from hakafka.coordination.records import ClusterSettings
from hakafka.coordination.session import ZkSession

log = structlog.get_logger("hakafka.coordination")


class SettingsStore:
    """Reads and writes `/settings` through one session."""

    def __init__(self, session: ZkSession) -> None:
        self._session = session

    def read(self) -> tuple[ClusterSettings, int] | None:
        """The recorded settings and their znode version, or None when nothing is recorded."""
        got = self._session.get(paths.SETTINGS)
        if got is None:
            return None
        return ClusterSettings.decode(paths.SETTINGS, got[0]), got[1].version

    def create(self, settings: ClusterSettings) -> bool:
        """Record `settings` if nothing is recorded yet; False if a record exists already."""
        try:
            self._session.create(paths.SETTINGS, settings.encode())
        except NodeExistsError:
            return False
        log.info("settings.recorded", shard_count=settings.shard_count)
        return True

    def replace(self, settings: ClusterSettings, version: int) -> bool:
        """Replace the record read at `version`; False if it changed since."""
        try:
            self._session.set(paths.SETTINGS, settings.encode(), version)
        except BadVersionError:
            return False
        log.info("settings.replaced", shard_count=settings.shard_count, after_version=version)
        return True

    def watch(self, on_change: Callable[[], None]) -> None:
        """Call `on_change()` now and after every creation, change or deletion of the record,
        across reconnections and new sessions. It runs on a kazoo thread: it must not block
        (set a flag; read the record elsewhere)."""

        def changed(_data: bytes | None, _stat: ZnodeStat | None) -> None:
            on_change()

        DataWatch(self._session.client, paths.SETTINGS, changed)
