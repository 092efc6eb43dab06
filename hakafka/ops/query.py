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
from hakafka.coordination import Coordinator, NodeInfo
from hakafka.ops.cluster import OpsError, format_table


@dataclass(frozen=True)
class ShardLeader:
    """A shard's leader as ZooKeeper names it, with its registered endpoints."""

    node: str
    endpoints: NodeInfo


def leaders(coordinator: Coordinator, shards: Sequence[int]) -> dict[int, ShardLeader]:
    """Shard -> its leader, for every shard of `shards`; an OpsError naming the first shard
    that has no leader or whose leader is not registered."""
    registered = coordinator.nodes()
    found: dict[int, ShardLeader] = {}
    for shard in shards:
        leader = coordinator.leader_of(shard)
        if leader is None:
            raise OpsError(
                f"shard {shard} has no leader right now; try again or see `hakafka status`"
            )
        endpoints = registered.get(leader.node)
        if endpoints is None:
            raise OpsError(f"shard {shard}: its leader {leader.node} is not registered")
        found[shard] = ShardLeader(leader.node, endpoints)
    return found


def query_shards(
    coordinator: Coordinator,
    shards: Sequence[int],
    sql: str,
    *,
    token: str | None,
    tls: ClientTls | None,
) -> pa.Table:
    """`sql` run for each of `shards` by its leader over that shard's buffers only (the
    `shard` parameter), results concatenated in shard order: an aggregate yields one row per
    shard, and a node leading several shards is asked once for each, so nothing is counted
    twice. Every shard answers or the whole query fails: a shard without a leader, whose
    leader is not registered, cannot be reached or refuses (its error, e.g. bad SQL) is an
    OpsError naming the shard, never a shard left out. Leaders are asked at their registered
    Flight URL, verified per `tls` (with it, a plain-text URL is an OpsError)."""
    tables = []
    for shard, leader in leaders(coordinator, shards).items():
        url = leader.endpoints.flight
        try:
            tables.append(remote_query(url, sql, token, tls=tls, shard=shard))
        except PlainTextRefusedError as exc:  # its text names the URL
            raise OpsError(f"shard {shard}: its leader {leader.node}: {exc}") from None
        except QueryFailedError as exc:
            raise OpsError(f"shard {shard}: its leader {leader.node} at {url}: {exc}") from None
    return pa.concat_tables(tables, promote_options="default")


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
