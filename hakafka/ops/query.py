"""`hakafka query`: SQL over the memory buffers of shard leaders, routed via ZooKeeper."""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.csv as pacsv

from buffer.client import PlainTextRefusedError, QueryFailedError
from buffer.client import query as remote_query
from buffer.formats import json_document
from buffer.tls import ClientTls
from hakafka.coordination import Coordinator, LeaderInfo
from hakafka.coordination.leader_wait import (
    LeaderNotAnswering,
    LeaderUnavailableError,
    ask_leader,
)
from hakafka.ops.cluster import OpsError, format_table


@dataclass(frozen=True)
class Answer:
    """The shards' rows in shard order, and the shards left out (`--partial`) with why."""

    table: pa.Table
    skipped: dict[int, str]


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
    `partial` the shard is left out and named in `skipped`. A leader that answers with an
    error (bad SQL) fails the query at once, naming the shard."""
    tables, skipped = [], {}
    for shard in shards:

        def ask(leader: LeaderInfo, shard: int = shard) -> pa.Table:
            endpoints = coordinator.nodes().get(leader.node)
            if endpoints is None:  # it died and its session ended
                raise LeaderNotAnswering(f"{leader.node} is not registered")
            url = endpoints.flight
            try:
                return remote_query(url, sql, token, tls=tls, shard=shard)
            except PlainTextRefusedError as exc:  # its text names the URL
                raise OpsError(f"shard {shard}: its leader {leader.node}: {exc}") from None
            except QueryFailedError as exc:
                if exc.unavailable:
                    raise LeaderNotAnswering(str(exc)) from exc
                raise OpsError(f"shard {shard}: its leader {leader.node} at {url}: {exc}") from None

        try:
            tables.append(ask_leader(shard, coordinator.leader_of, ask, wait_s=wait_s))
        except LeaderUnavailableError as exc:
            if not partial:
                raise OpsError(f"{exc}; see `hakafka status`") from None
            skipped[shard] = str(exc)
    if not tables:
        raise OpsError("no shard answered: " + "; ".join(skipped.values()))
    return Answer(pa.concat_tables(tables, promote_options="default"), skipped)


def render(table: pa.Table, fmt: str) -> bytes:
    """`table` as a text table, JSON rows, CSV with header, or an Arrow IPC stream."""
    if fmt == "table":
        rows = [list(r.values()) for r in table.to_pylist()]
        text = format_table(table.column_names, rows)
        return f"{text}\n({table.num_rows} rows)\n".encode()
    if fmt == "json":
        return json_document(table) + b"\n"
    sink = io.BytesIO()
    if fmt == "csv":
        pacsv.write_csv(table, sink)
    else:
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
    return sink.getvalue()
