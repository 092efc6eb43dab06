"""Paused pipelines (`shards/<s>/paused/<pipeline>`) and the ops writes they allow.

The protocol (driven by `hakafka pipeline pause|resume`, `hakafka offsets set` and
`hakafka pending drop`, see `hakafka/ops/offsets.py`):

1. `pause`: ops create the flag. It is persistent: the shard's leader, and any later leader,
   runs no pipeline that has one.
2. `acknowledge`: the leader, once the pipeline's threads ended in its term, records itself in
   the flag (`held`), fenced by its epoch.
3. `move`: while the flag names the current term (the epoch is still at `held.token`, and the
   flag is unchanged since it was read), ops replace the checkpoint and may delete the pending
   intent, in one multi-op. Nothing of the pipeline runs then, so no leader write can race it.
4. `resume`: ops delete the flag; the leader starts the pipeline, which reads checkpoint and
   pending like any new term.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import structlog
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError
from kazoo.recipe.watchers import ChildrenWatch

from hakafka.coordination import paths
from hakafka.coordination.errors import CoordinationError, FencedError
from hakafka.coordination.fenced import StoredCheckpoint, stored_checkpoint
from hakafka.coordination.records import (
    Checkpoint,
    HeldBy,
    PauseRecord,
    PendingIntent,
    encode_checkpoint,
)
from hakafka.coordination.session import ZkSession

log = structlog.get_logger("hakafka.coordination")

_ATTEMPTS = 3


class PauseRaceError(CoordinationError):
    """An ops write on a paused pipeline did not happen: something it checked changed (named
    in the message); nothing was written."""


@dataclass(frozen=True)
class StoredPause:
    """A pause flag and its znode version."""

    record: PauseRecord
    version: int


@dataclass(frozen=True)
class StoredPending:
    """A pending intent and its znode version."""

    intent: PendingIntent
    version: int


class PauseStore:
    """Reads and writes the pause flags of every shard, through one session."""

    def __init__(self, session: ZkSession) -> None:
        self._session = session

    def pause(self, shard: int, pipeline: str, record: PauseRecord) -> bool:
        """Pause `pipeline` in `shard`; False if it already was (the flag is left as it is)."""
        self._session.ensure(paths.paused_pipelines(shard))
        try:
            self._session.create(paths.paused(shard, pipeline), record.encode())
        except NodeExistsError:
            return False
        log.info("pipeline.pause_requested", shard=shard, pipeline=pipeline, by=record.by)
        return True

    def resume(self, shard: int, pipeline: str) -> bool:
        """Remove the flag; False if `pipeline` was not paused in `shard`."""
        resumed = self._session.delete(paths.paused(shard, pipeline))
        if resumed:
            log.info("pipeline.resume_requested", shard=shard, pipeline=pipeline)
        return resumed

    def resume_expired(self, shard: int, pipeline: str, stored: StoredPause) -> bool:
        """Remove the flag if it is still `stored` (unchanged since read); False if it
        changed or went. For a leader resuming a pause whose deadline passed."""
        try:
            return self._session.delete(paths.paused(shard, pipeline), stored.version)
        except BadVersionError:
            return False

    def read(self, shard: int, pipeline: str) -> StoredPause | None:
        """The flag of `pipeline` in `shard`, or None when it is not paused."""
        path = paths.paused(shard, pipeline)
        got = self._session.get(path)
        return (
            None if got is None else StoredPause(PauseRecord.decode(path, got[0]), got[1].version)
        )

    def paused(self, shard: int) -> dict[str, PauseRecord]:
        """Every paused pipeline of `shard`, by name."""
        found: dict[str, PauseRecord] = {}
        for name in self._session.children(paths.paused_pipelines(shard)):
            if (stored := self.read(shard, name)) is not None:
                found[name] = stored.record
        return found

    def watch(self, shard: int, on_change: Callable[[frozenset[str]], None]) -> None:
        """Call `on_change(names)` now and whenever a pipeline of `shard` is paused or resumed.
        It runs on a kazoo thread: it must not block."""
        parent = paths.paused_pipelines(shard)
        self._session.ensure(parent)

        def changed(names: list[str]) -> None:
            on_change(frozenset(names))

        ChildrenWatch(self._session.client, parent, changed)

    def acknowledge(self, shard: int, pipeline: str, held: HeldBy) -> bool:
        """Record that `pipeline` stopped in the term of `held.token`; False if it is not
        paused (any more). FencedError if that term is over."""
        path = paths.paused(shard, pipeline)
        for _ in range(_ATTEMPTS):
            stored = self.read(shard, pipeline)
            if stored is None:
                return False
            if stored.record.held == held:
                return True
            txn = self._session.transaction()
            txn.check(paths.epoch(shard), held.token)
            txn.set_data(path, replace(stored.record, held=held).encode(), version=stored.version)
            first, second = self._session.commit(txn, path)
            if isinstance(first, (BadVersionError, NoNodeError)):
                raise FencedError(
                    f"shard {shard}: pause acknowledgement refused: epoch {held.epoch} is over"
                )
            if isinstance(second, Exception):
                continue  # the flag changed or went since it was read: read it again
            log.info("pipeline.paused", shard=shard, pipeline=pipeline, epoch=held.epoch)
            return True
        raise CoordinationError(
            f"{path}: changed {_ATTEMPTS} times while acknowledged; retried later"
        )

    def pending(self, shard: int, pipeline: str) -> StoredPending | None:
        """The pending intent of `pipeline` in `shard` with its version, or None."""
        path = paths.pending(shard, pipeline)
        got = self._session.get(path)
        return (
            None
            if got is None
            else StoredPending(PendingIntent.decode(path, got[0]), got[1].version)
        )

    def checkpoint(self, shard: int, pipeline: str) -> StoredCheckpoint:
        """The checkpoint of `pipeline` in `shard` with its version (what `move` replaces)."""
        return stored_checkpoint(self._session, shard, pipeline)

    def move(
        self,
        shard: int,
        pipeline: str,
        *,
        pause: StoredPause,
        stored: StoredCheckpoint,
        checkpoint: Checkpoint,
        drop: StoredPending | None,
    ) -> None:
        """Replace `pipeline`'s checkpoint in `shard` (`stored` -> `checkpoint`, in any
        direction) and delete the pending intent `drop`, in one multi-op that checks the
        pause still holds in its term: the epoch at `pause.record.held.token` and the flag at
        `pause.version`. PauseRaceError (nothing written) names what changed."""
        held = pause.record.held
        if held is None:
            raise PauseRaceError(
                f"shard {shard}, pipeline {pipeline}: not stopped by a leader yet; nothing written"
            )
        flag, cp_path = paths.paused(shard, pipeline), paths.checkpoint(shard, pipeline)
        self._session.ensure(paths.pipeline(shard, pipeline))
        txn = self._session.transaction()
        checks = [
            f"shard {shard} still led by {held.node} in epoch {held.epoch}",
            f"{flag} unchanged",
        ]
        txn.check(paths.epoch(shard), held.token)
        txn.check(flag, pause.version)
        checks.append(f"{cp_path} unchanged")
        if stored.version is None:
            txn.create(cp_path, encode_checkpoint(checkpoint))
        else:
            txn.set_data(cp_path, encode_checkpoint(checkpoint), version=stored.version)
        if drop is not None:
            txn.delete(paths.pending(shard, pipeline), version=drop.version)
            checks.append(f"pending block {drop.intent.block_id} unchanged")
        results = self._session.commit(txn, cp_path)
        failed = [
            f"{what}: {type(r).__name__}"
            for what, r in zip(checks, results, strict=False)
            if isinstance(r, Exception) and type(r).__name__ != "RolledBackError"
        ]
        if failed:
            raise PauseRaceError(
                f"shard {shard}, pipeline {pipeline}: nothing written: " + "; ".join(failed)
            )
        log.warning(
            "offsets.moved",
            shard=shard,
            pipeline=pipeline,
            before={t: dict(p) for t, p in stored.offsets.items()},
            after={t: dict(p) for t, p in checkpoint.items()},
            dropped=None if drop is None else drop.intent.block_id,
        )
