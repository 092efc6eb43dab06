"""Push writers' numbers: each writer of a pipeline's pushed batches gets a number, kept in
ZooKeeper for the whole cluster, so that every leader gives the writer the same one and no
two writers share one in any shard: (`_partition`, `_offset`) stays unique in a pipeline's
rows over every shard (`read_table` relies on it).

A writer pushes to one shard. It is a child `<writer>@<shard>@<10 digits>` of
`paths.writers(pipeline)`, created with ZooKeeper's sequence suffix in a transaction that
checks the pushing shard's epoch. Its number is that sequence; were it created twice (a
reply lost and the create retried, or two shards racing for a new writer), the lowest
counts, and with it its shard. The pipeline turns the number into the writer's partition
(`pipeline/push.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hakafka.coordination import paths
from hakafka.coordination.errors import CoordinationError
from hakafka.coordination.session import ZkSession

SEPARATOR = "@"  # not a character of a name `paths.check_name` accepts
# Where a checkpoint names the writers' partitions (negative: `pipeline/push.py`); never a
# Kafka topic's name, '@' is not allowed in one.
PUSH_TOPIC = "@push"


class WriterElsewhereError(ValueError):
    """The writer pushes to another shard; the message names both."""


def read_writers(session: ZkSession, pipeline: str) -> dict[str, tuple[int, int]]:
    """Every writer of `pipeline` with its (number, shard): those of its lowest child."""
    found: dict[str, tuple[int, int]] = {}
    for child in session.children(paths.writers(pipeline)):
        rest, _, digits = child.rpartition(SEPARATOR)
        name, _, shard = rest.rpartition(SEPARATOR)
        if not (name and shard.isdigit() and digits.isdigit()):
            continue  # not a writer's znode
        entry = (int(digits), int(shard))
        found[name] = min(entry, found.get(name, entry))
    return found


def add_writer(
    session: ZkSession,
    shard: int,
    pipeline: str,
    writer: str,
    *,
    fence: Callable[[Any], object],
    commit: Callable[[Any], bool],
) -> int:
    """`writer`'s number, numbered now for `shard` if it has none. WriterElsewhereError if it
    pushes to another shard. `fence(txn)` adds the term's epoch check to the transaction,
    `commit(txn)` runs it (FencedError once the term is over)."""
    paths.check_name("writer", writer)
    parent = paths.writers(pipeline)
    known = read_writers(session, pipeline).get(writer)
    if known is None:
        session.ensure(parent)
        txn = session.transaction()
        fence(txn)
        txn.create(f"{parent}/{writer}{SEPARATOR}{shard}{SEPARATOR}", b"", sequence=True)
        if not commit(txn):
            raise CoordinationError(f"{parent}: numbering writer {writer!r} failed; try again")
        known = read_writers(session, pipeline)[writer]
    number, home = known
    if home != shard:
        raise WriterElsewhereError(
            f"writer {writer!r} pushes to shard {home} of pipeline {pipeline!r}, not to shard "
            f"{shard}: use a writer id per shard"
        )
    return number
