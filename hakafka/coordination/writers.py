"""Push writers' numbers: each writer of a pipeline's pushed batches gets a small number, kept
in ZooKeeper so that every leader of the shard gives the writer the same one.

A writer is a child `<writer>@<10 digits>` of `paths.writers(shard, pipeline)`, created with
ZooKeeper's sequence suffix in a transaction that checks the term's epoch. Its number is
that sequence; were it created twice (a reply lost and the create retried), the lowest
counts. The pipeline turns the number into the writer's partition (`pipeline/push.py`).
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


def read_writers(session: ZkSession, shard: int, pipeline: str) -> dict[str, int]:
    """Every writer of `pipeline` in `shard` with its number (the lowest of its children)."""
    found: dict[str, int] = {}
    for child in session.children(paths.writers(shard, pipeline)):
        name, sep, digits = child.rpartition(SEPARATOR)
        if not sep or not digits.isdigit():
            continue  # not a writer's znode
        number = int(digits)
        found[name] = min(number, found.get(name, number))
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
    """Number `writer` (once: a writer already there keeps its number). `fence(txn)` adds the
    term's epoch check to the transaction, `commit(txn)` runs it (FencedError once the term
    is over)."""
    paths.check_name("writer", writer)
    parent = paths.writers(shard, pipeline)
    if (known := read_writers(session, shard, pipeline).get(writer)) is not None:
        return known
    session.ensure(parent)
    txn = session.transaction()
    fence(txn)
    txn.create(f"{parent}/{writer}{SEPARATOR}", b"", sequence=True)
    if not commit(txn):
        raise CoordinationError(f"{parent}: numbering writer {writer!r} failed; try again")
    return read_writers(session, shard, pipeline)[writer]
