"""A reshard in progress (`/reshard`): request it, report each shard drained, and complete it
with one multi-op that moves every checkpoint and records the new layout.

The protocol (driven by `hakafka reshard`, see `hakafka/ops/reshard.py`):

1. `request`: `/reshard` names the `/settings` version it was made against. Every leader of
   the recorded layout drains: it stops consuming, commits everything its WAL, buffer and
   pending intent hold, and holds its leadership idle.
2. `mark_drained`: each such leader reports `/reshard/<shard>`, fenced by its epoch (a
   multi-op that checks the shard's epoch version), so a report never outlives its term.
3. `complete`: one multi-op checks `/settings` is still at that version and every shard's
   epoch is still the drained term's (no other leader consumed since), writes each
   pipeline's checkpoints in the new layout, records the new settings and removes
   `/reshard`. Leaders of the old layout then differ from the record and step down; nodes
   configured with the new layout stand.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import structlog
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError, NotEmptyError
from kazoo.protocol.states import ZnodeStat
from kazoo.recipe.watchers import DataWatch

from hakafka.coordination import paths
from hakafka.coordination.errors import CoordinationError, FencedError
from hakafka.coordination.fenced import StoredCheckpoint, stored_checkpoint
from hakafka.coordination.records import (
    Checkpoint,
    ClusterSettings,
    DrainedInfo,
    ReshardRequest,
    encode_checkpoint,
)
from hakafka.coordination.session import ZkSession

log = structlog.get_logger("hakafka.coordination")

_ABORT_ATTEMPTS = 5


class ReshardRaceError(CoordinationError):
    """The reshard could not complete: something it checked changed (named in the message)."""


class ReshardStore:
    """Reads and writes `/reshard` and the checkpoints it moves, through one session."""

    def __init__(self, session: ZkSession) -> None:
        self._session = session

    def read(self) -> ReshardRequest | None:
        """The reshard in progress, or None."""
        got = self._session.get(paths.RESHARD)
        return None if got is None else ReshardRequest.decode(paths.RESHARD, got[0])

    def request(self, request: ReshardRequest) -> bool:
        """Start a reshard; False if one is already in progress."""
        try:
            self._session.create(paths.RESHARD, request.encode())
        except NodeExistsError:
            return False
        log.info("reshard.requested", by=request.by, shard_count=request.shard_count)
        return True

    def abort_expired(self, request: ReshardRequest) -> bool:
        """Abort the reshard in progress if it is still `request` (made at the same time by
        the same operator); False if another one runs now, or none."""
        current = self.read()
        if current is None or (current.by, current.at) != (request.by, request.at):
            return False
        return self.abort()

    def abort(self) -> bool:
        """End the reshard in progress without moving anything; False if there was none.
        Leaders that drained resume consuming."""
        for _ in range(_ABORT_ATTEMPTS):
            for name in self._session.children(paths.RESHARD):
                self._session.delete(paths.child(paths.RESHARD, name))
            try:
                aborted = self._session.delete(paths.RESHARD)
            except NotEmptyError:
                continue  # a drained report landed meanwhile: remove it too
            if aborted:
                log.warning("reshard.aborted")
            return aborted
        raise CoordinationError(
            f"{paths.RESHARD}: not removed after {_ABORT_ATTEMPTS} attempts (drained reports "
            "kept arriving); run hakafka reshard --abort again"
        )

    def watch(self, on_change: Callable[[], None]) -> None:
        """Call `on_change()` now and whenever `/reshard` is created, changed or deleted. It
        runs on a kazoo thread: it must not block."""

        def changed(_data: bytes | None, _stat: ZnodeStat | None) -> None:
            on_change()

        DataWatch(self._session.client, paths.RESHARD, changed)

    def drained(self) -> dict[int, DrainedInfo]:
        """The shards whose leader reported drained, by shard."""
        found: dict[int, DrainedInfo] = {}
        for name in self._session.children(paths.RESHARD):
            path = paths.child(paths.RESHARD, name)
            got = self._session.get(path)
            if name.isdigit() and got is not None:
                found[int(name)] = DrainedInfo.decode(path, got[0])
        return found

    def mark_drained(self, shard: int, info: DrainedInfo) -> bool:
        """Report `shard` drained in the term of `info.token`; False if no reshard is in
        progress (any more). FencedError if that term is over."""
        path = paths.drained(shard)
        stale = self._session.exists(path)  # an earlier term's report: replaced
        txn = self._session.transaction()
        txn.check(paths.epoch(shard), info.token)
        if stale is None:
            txn.create(path, info.encode())
        else:
            txn.set_data(path, info.encode(), version=stale.version)
        first, second = self._session.commit(txn, path)
        if isinstance(first, (BadVersionError, NoNodeError)):
            raise FencedError(f"shard {shard}: drained report refused: epoch {info.epoch} is over")
        if isinstance(second, NoNodeError) and self._session.exists(paths.RESHARD) is None:
            return False  # /reshard is gone: aborted or completed
        if isinstance(second, Exception):
            raise CoordinationError(f"{path}: {second!r} (retried at the next supervision)")
        log.info("reshard.drained", shard=shard, node=info.node, epoch=info.epoch)
        return True

    def checkpoint(self, shard: int, pipeline: str) -> StoredCheckpoint:
        """`pipeline`'s checkpoint in `shard`, with its znode version."""
        return stored_checkpoint(self._session, shard, pipeline)

    def complete(
        self,
        request: ReshardRequest,
        settings: ClusterSettings,
        drained: Mapping[int, DrainedInfo],
        checkpoints: Mapping[tuple[int, str], tuple[StoredCheckpoint, Checkpoint]],
    ) -> None:
        """In one multi-op: check `/settings` is at `request.settings_version` and every
        drained shard's epoch still at its token; replace each `(shard, pipeline)` checkpoint
        (stored -> new; an empty new one is deleted); record `settings`; remove `/reshard`.
        ReshardRaceError (nothing written) names what changed."""
        for shard, pipeline in checkpoints:
            self._session.ensure(paths.pipeline(shard, pipeline))
        txn = self._session.transaction()
        checks = [f"{paths.SETTINGS} at version {request.settings_version}"]
        txn.check(paths.SETTINGS, request.settings_version)
        for shard, info in sorted(drained.items()):
            txn.check(paths.epoch(shard), info.token)
            checks.append(f"shard {shard} led by {info.node} in epoch {info.epoch}")
        for (shard, pipeline), (stored, new) in sorted(checkpoints.items()):
            path = paths.checkpoint(shard, pipeline)
            checks.append(f"{path} unchanged")
            if stored.version is None and new:
                txn.create(path, encode_checkpoint(new))
            elif stored.version is not None and new:
                txn.set_data(path, encode_checkpoint(new), version=stored.version)
            elif stored.version is not None:
                txn.delete(path, version=stored.version)
            else:
                checks.pop()
        txn.set_data(paths.SETTINGS, settings.encode(), version=request.settings_version)
        checks.append(f"{paths.SETTINGS} recorded")
        for shard in sorted(drained):
            txn.delete(paths.drained(shard))
            checks.append(f"{paths.drained(shard)} removed")
        txn.delete(paths.RESHARD)
        checks.append(f"{paths.RESHARD} removed")
        results = self._session.commit(txn, paths.RESHARD)
        failed = [
            f"{what}: {type(r).__name__}"
            for what, r in zip(checks, results, strict=False)
            if isinstance(r, Exception) and type(r).__name__ != "RolledBackError"
        ]
        if failed:
            raise ReshardRaceError("reshard not completed, nothing written: " + "; ".join(failed))
        log.info("reshard.completed", shard_count=settings.shard_count)
