"""Fenced state of a shard's pipelines: the checkpoint and the pending flush intent.

Every write is one ZooKeeper multi-op that first checks the shard's `epoch` znode still has
the version this leader got when it was elected (the fencing token), so a leader that lost
its session cannot change anything once a successor was elected. A checkpoint only moves
forward: a commit below the committed offset is refused (`CheckpointRegressionError`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog
from kazoo.exceptions import BadVersionError, NoNodeError

from hakafka.coordination import paths
from hakafka.coordination.errors import CoordinationError, FencedError
from hakafka.coordination.records import (
    Checkpoint,
    PendingIntent,
    decode_checkpoint,
    encode_checkpoint,
)
from hakafka.coordination.session import ZkSession
from hakafka.coordination.writers import add_writer

log = structlog.get_logger("hakafka.coordination")

_ATTEMPTS = 3


class CheckpointRegressionError(CoordinationError):
    """A checkpoint commit would move some partition's offset backwards (a bug or a second
    writer); nothing was written."""


def check_monotonic(shard: int, pipeline: str, committed: Checkpoint, proposed: Checkpoint) -> None:
    """Raise `CheckpointRegressionError` naming every partition whose `proposed` offset is
    below its `committed` one."""
    behind = [
        f"{topic}[{partition}]: committed {committed[topic][partition]}, proposed {offset}"
        for topic, parts in sorted(proposed.items())
        for partition, offset in sorted(parts.items())
        if offset < committed.get(topic, {}).get(partition, offset)
    ]
    if behind:
        raise CheckpointRegressionError(
            f"shard {shard}, pipeline {pipeline}: checkpoint commit refused, it would move "
            f"backwards ({'; '.join(behind)}); nothing written"
        )


@dataclass(frozen=True)
class StoredCheckpoint:
    """A pipeline's checkpoint in one shard and its znode version (None: no znode)."""

    offsets: Checkpoint
    version: int | None


def stored_checkpoint(session: ZkSession, shard: int, pipeline: str) -> StoredCheckpoint:
    """`pipeline`'s checkpoint in `shard`, with its znode version (for a version-checked
    write by ops: a reshard, an offsets move)."""
    path = paths.checkpoint(shard, pipeline)
    got = session.get(path)
    if got is None:
        return StoredCheckpoint({}, None)
    return StoredCheckpoint(decode_checkpoint(path, got[0]), got[1].version)


class FencedState:
    """Checkpoint and pending intent of one shard's pipelines, bound to one fencing token.

    `still_leading()` answers whether the holder still leads with this token; when it does
    not, every method raises `FencedError` without touching ZooKeeper.
    """

    def __init__(
        self,
        session: ZkSession,
        shard: int,
        epoch: int,
        token: int,
        still_leading: Callable[[], bool],
    ) -> None:
        self._session = session
        self.shard = shard
        self.epoch = epoch
        self.token = token
        self._still_leading = still_leading

    def _require_leading(self, what: str) -> None:
        if not self._still_leading():
            raise FencedError(
                f"shard {self.shard}: {what} refused: this node no longer leads with epoch "
                f"{self.epoch} (epoch version {self.token})"
            )

    def read_checkpoint(self, pipeline: str) -> Checkpoint:
        """The committed checkpoint of `pipeline` ({} if none was ever committed)."""
        self._require_leading("read_checkpoint")
        path = paths.checkpoint(self.shard, pipeline)
        got = self._session.get(path)
        return {} if got is None else decode_checkpoint(path, got[0])

    def checkpoint_age(self, pipeline: str) -> float | None:
        """Seconds since `pipeline`'s checkpoint was last written, by this term or an earlier
        one (ZooKeeper's mtime against this clock, at least 0); None if there is none."""
        self._require_leading("checkpoint_age")
        stat = self._session.exists(paths.checkpoint(self.shard, pipeline))
        return None if stat is None else max(0.0, time.time() - stat.mtime / 1000.0)

    def read_other_checkpoints(self, pipeline: str) -> dict[int, Checkpoint]:
        """`pipeline`'s checkpoints in the other shards, by shard (those that have one)."""
        self._require_leading("read_other_checkpoints")
        found: dict[int, Checkpoint] = {}
        for name in self._session.children(paths.SHARDS):
            if not name.isdigit() or int(name) == self.shard:
                continue
            path = paths.checkpoint(int(name), pipeline)
            if (got := self._session.get(path)) is not None:
                found[int(name)] = decode_checkpoint(path, got[0])
        return found

    def read_pending(self, pipeline: str) -> PendingIntent | None:
        """The flush intent left by the last writer, or None."""
        self._require_leading("read_pending")
        path = paths.pending(self.shard, pipeline)
        got = self._session.get(path)
        return None if got is None else PendingIntent.decode(path, got[0])

    def write_pending(self, pipeline: str, intent: PendingIntent) -> None:
        """Store `intent` as the pipeline's pending flush (replacing any earlier one)."""
        self._require_leading("write_pending")
        path = paths.pending(self.shard, pipeline)
        self._session.ensure(paths.pipeline(self.shard, pipeline))
        for _ in range(_ATTEMPTS):
            exists = self._session.exists(path) is not None
            txn = self._session.transaction()
            txn.check(paths.epoch(self.shard), self.token)
            if exists:
                txn.set_data(path, intent.encode())
            else:
                txn.create(path, intent.encode())
            if self._commit(txn, path, "write_pending"):
                log.info(
                    "fenced.pending_written",
                    shard=self.shard,
                    pipeline=pipeline,
                    block=intent.block_id,
                    epoch=self.epoch,
                )
                return
        raise CoordinationError(f"{path}: write_pending kept racing with itself; gave up")

    def writer_number(self, pipeline: str, writer: str) -> int:
        """`writer`'s number among `pipeline`'s push writers, numbered now for this shard if
        it has none (a fenced write: FencedError once this term is over);
        WriterElsewhereError if it pushes to another shard."""
        self._require_leading("writer_number")
        return add_writer(
            self._session,
            self.shard,
            pipeline,
            writer,
            fence=lambda txn: txn.check(paths.epoch(self.shard), self.token),
            commit=lambda txn: self._commit(txn, paths.writers(pipeline), "writer"),
        )

    def commit_checkpoint(self, pipeline: str, offsets: Checkpoint) -> Checkpoint:
        """Merge `offsets` into the checkpoint and delete the pending intent, atomically.

        Partitions not named in `offsets` keep their committed offset. Returns the new
        checkpoint. Raises `FencedError` (nothing written) if this node no longer leads, and
        `CheckpointRegressionError` (nothing written) if an offset is below the committed
        one: the comparison is against the version read, which the multi-op checks.
        """
        self._require_leading("commit_checkpoint")
        cp_path = paths.checkpoint(self.shard, pipeline)
        pending_path = paths.pending(self.shard, pipeline)
        self._session.ensure(paths.pipeline(self.shard, pipeline))
        for _ in range(_ATTEMPTS):
            got = self._session.get(cp_path)
            merged = {} if got is None else decode_checkpoint(cp_path, got[0])
            check_monotonic(self.shard, pipeline, merged, offsets)
            for topic, parts in offsets.items():
                merged.setdefault(topic, {}).update(parts)
            has_pending = self._session.exists(pending_path) is not None
            txn = self._session.transaction()
            txn.check(paths.epoch(self.shard), self.token)
            if got is None:
                txn.create(cp_path, encode_checkpoint(merged))
            else:
                txn.set_data(cp_path, encode_checkpoint(merged), version=got[1].version)
            if has_pending:
                txn.delete(pending_path)
            if self._commit(txn, cp_path, "commit_checkpoint"):
                log.info(
                    "fenced.checkpoint_committed",
                    shard=self.shard,
                    pipeline=pipeline,
                    epoch=self.epoch,
                    offsets={t: dict(p) for t, p in offsets.items()},
                )
                return merged
        raise CoordinationError(f"{cp_path}: commit_checkpoint kept racing with itself; gave up")

    def _commit(self, txn: Any, path: str, what: str) -> bool:
        """True if committed; False if a non-epoch op lost a race (retry); FencedError if the
        epoch check failed."""
        self._require_leading(what)
        results = self._session.commit(txn, path)
        first = results[0]
        if isinstance(first, (BadVersionError, NoNodeError)):
            raise FencedError(
                f"shard {self.shard}: {what} on {path} fenced: expected epoch version "
                f"{self.token} (epoch {self.epoch}), found {self._found_epoch()}"
            )
        failures = [repr(r) for r in results if isinstance(r, Exception)]
        if failures:
            log.info("fenced.retry", shard=self.shard, what=what, errors=failures)
        return not failures

    def _found_epoch(self) -> str:
        try:
            got = self._session.get(paths.epoch(self.shard))
        except CoordinationError as exc:
            return f"unknown ({exc})"
        if got is None:
            return "no epoch znode"
        return f"epoch version {got[1].version} (epoch {got[0].decode(errors='replace')})"
