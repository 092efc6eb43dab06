"""Records produced for a test and what of them landed in ClickHouse: row counts while a
test waits for rows, and the exactly-once tally by (`_partition`, `_offset`) at its end."""

from __future__ import annotations

from typing import Any

from devstack.records import Produced, tally
from devstack.records import produce as produce_records

# The partitions of the topics the cluster tests create and `produce` writes to.
PARTITIONS = 8


def produce(
    bootstrap: str, topic: str, count: int, *, start: int = 0, bad_every: int = 0
) -> Produced:
    """Records `start..start+count-1` round-robin over the `PARTITIONS` of `topic` (every
    `bad_every`-th one malformed), with the (partition, offset) the broker gave each."""
    return produce_records(
        bootstrap, topic, count, partitions=PARTITIONS, start=start, bad_every=bad_every
    )


def count(client: Any, table: str) -> int:
    """Rows in `table` now (duplicates included); the table must exist."""
    return int(client.command(f"SELECT count() FROM {table}"))


def landed(client: Any, table: str) -> int:
    """Rows in `table` so far, 0 while it does not exist: a new leader creates its tables in
    its flush thread, after the election, so a wait for rows may begin before them."""
    return count(client, table) if int(client.command(f"EXISTS TABLE {table}")) else 0


def stats(client: Any, table: str = "events") -> tuple[int, int]:
    """(rows, distinct (`_partition`, `_offset`) pairs) in `table`: equal when nothing landed
    twice."""
    row = client.query(f"SELECT count(), uniqExact(_partition, _offset) FROM {table}").result_rows
    return int(row[0][0]), int(row[0][1])


def assert_exactly_once(client: Any, table: str, expected: set[tuple[int, int]]) -> None:
    """Fail unless `table` holds each (`_partition`, `_offset`) of `expected` exactly once and
    nothing else; the message names the table and the tally."""
    result = tally(client, table, expected)
    assert result.exactly_once, f"{table}: {result}"
