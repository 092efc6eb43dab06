"""`hakafka query`: SQL over the memory buffers of shard leaders, routed via ZooKeeper."""

from __future__ import annotations

import io
import re
from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.csv as pacsv

from buffer.client import PlainTextRefusedError, QueryFailedError
from buffer.client import query as remote_query
from buffer.formats import encode_arrow, json_document
from buffer.sql import SHARD_COLUMN
from buffer.tls import ClientTls
from hakafka.coordination import Coordinator, LeaderInfo
from hakafka.coordination.leader_wait import (
    LeaderNotAnswering,
    LeaderUnavailableError,
    ask_leader,
)
from hakafka.ops.cluster import OpsError, clock, format_table

DIALECT_HINT = (
    "the buffer speaks DuckDB's SQL: quote a column named like a keyword in double quotes, "
    'e.g. SELECT "at" FROM events'
)


@dataclass(frozen=True)
class Answer:
    """Each shard's rows, the shards left out (`--partial`) with why, and notes on shards
    whose answer may be incomplete (a leader still recovering)."""

    tables: dict[int, pa.Table]
    skipped: dict[int, str]
    notes: list[str]

    @property
    def table(self) -> pa.Table:
        """The shards' rows in shard order."""
        return pa.concat_tables(self.tables.values(), promote_options="default")

    def labelled(self) -> pa.Table:
        """`table` with a first column `shard` saying which shard each row came from (when
        the rows do not carry `_shard` already), so that one aggregate row per shard reads
        as such."""
        table = self.table
        if SHARD_COLUMN in table.column_names or "shard" in table.column_names:
            return table
        shards = [s for s, t in self.tables.items() for _ in range(t.num_rows)]
        return table.add_column(0, "shard", pa.array(shards, pa.int32()))


class PipelinePausedError(OpsError):
    """The query names a pipeline ops paused on a shard: its buffer is not served."""


def query_shards(
    coordinator: Coordinator,
    shards: Sequence[int],
    sql: str,
    *,
    token: str | None,
    tls: ClientTls | None,
    wait_s: float,
    partial: bool = False,
) -> Answer:
    """`sql` run for each of `shards` by its leader over that shard's buffers only (the
    `shard` parameter), results concatenated in shard order: an aggregate yields one row per
    shard, and a node leading several shards is asked once for each, so nothing is counted
    twice. Leaders are asked at their registered Flight URL, verified per `tls` (with it, a
    plain-text URL is an OpsError).

    A shard without a leader, or whose leader does not answer (killed, its `leader` znode
    not yet expired), is waited for: `leader` is read again until the next leader answers,
    up to `wait_s`. Then the query fails with an OpsError naming the shard, or with
    `partial` the shard is left out and named in `skipped`; so is a shard where the query
    names a pipeline ops paused (PipelinePausedError without `partial`). A leader that
    answers with an error (bad SQL) fails the query at once, naming the shard. A leader
    still recovering answers with what it holds, and `notes` says so."""
    tables: dict[int, pa.Table] = {}
    skipped: dict[int, str] = {}
    notes: list[str] = []
    for shard in shards:

        def ask(leader: LeaderInfo, shard: int = shard) -> pa.Table:
            endpoints = coordinator.nodes().get(leader.node)
            if endpoints is None:  # it died and its session ended
                raise LeaderNotAnswering(f"{leader.node} is not registered")
            url = endpoints.flight
            try:
                answer = remote_query(url, sql, token, tls=tls, shard=shard)
            except PlainTextRefusedError as exc:  # its text names the URL
                raise OpsError(f"shard {shard}: its leader {leader.node}: {exc}") from None
            except QueryFailedError as exc:
                if exc.unavailable:
                    raise LeaderNotAnswering(str(exc)) from exc
                _raise_paused(coordinator, shard, str(exc))
                hint = f" ({DIALECT_HINT})" if "Parser Error" in str(exc) else ""
                raise OpsError(
                    f"shard {shard}: its leader {leader.node} at {url}: {exc}{hint}"
                ) from None
            if leader.status != "consuming":
                notes.append(
                    f"shard {shard}: its leader {leader.node} is {leader.status}, not "
                    "consuming yet: its buffer may not hold every row it will serve"
                )
            return answer

        try:
            tables[shard] = ask_leader(shard, coordinator.leader_of, ask, wait_s=wait_s)
        except (LeaderUnavailableError, PipelinePausedError) as exc:
            if not partial:
                also = "" if len(shards) == 1 else "; --partial answers from the other shards"
                raise OpsError(f"{exc}; see `hakafka status`{also}") from None
            skipped[shard] = str(exc)
    if not tables:
        raise OpsError("no shard answered: " + "; ".join(skipped.values()))
    return Answer(tables, skipped, list(dict.fromkeys(notes)))


_MISSING_TABLE = re.compile(r"Table with name (\w+) does not exist")


def _raise_paused(coordinator: Coordinator, shard: int, error: str) -> None:
    """PipelinePausedError when `error` is about a missing table that is a pipeline (or its
    dead-letter table) ops paused on `shard`."""
    missing = _MISSING_TABLE.search(error)
    if missing is None:
        return
    for name, pause in coordinator.pauses.paused(shard).items():
        if missing.group(1) in (name, f"{name}_dead_letter"):
            raise PipelinePausedError(
                f"shard {shard}: pipeline {name} is paused (by {pause.by} since "
                f"{clock(pause.at)}: {pause.reason}); its buffer is served again after "
                f"`hakafka pipeline resume --pipeline {name} --shard {shard}`"
            )


def render(table: pa.Table, fmt: str) -> bytes:
    """`table` as a text table, JSON rows, CSV with header, or an Arrow IPC stream."""
    if fmt == "table":
        rows = [list(r.values()) for r in table.to_pylist()]
        text = format_table(table.column_names, rows)
        return f"{text}\n({table.num_rows} rows)\n".encode()
    if fmt == "json":
        return json_document(table) + b"\n"
    if fmt != "csv":
        return encode_arrow(table)
    sink = io.BytesIO()
    pacsv.write_csv(table, sink)
    return sink.getvalue()
