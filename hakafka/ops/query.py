"""`hakafka query`: SQL over the memory buffers of shard leaders, routed via ZooKeeper."""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from typing import TextIO

import pyarrow as pa
import pyarrow.csv as pacsv

from buffer.client import PlainTextRefusedError
from buffer.client import query as remote_query
from buffer.tls import ClientTls
from hakafka.coordination import Coordinator
from hakafka.ops.cluster import OpsError, format_table


def leaders(coordinator: Coordinator, shards: Sequence[int]) -> dict[str, list[int]]:
    """Leader node -> the shards of `shards` it leads; OpsError if one has no leader."""
    found: dict[str, list[int]] = {}
    for shard in shards:
        leader = coordinator.leader_of(shard)
        if leader is None:
            raise OpsError(
                f"shard {shard} has no leader right now; try again or see `hakafka status`"
            )
        found.setdefault(leader.node, []).append(shard)
    return found


def query_shards(
    coordinator: Coordinator,
    shards: Sequence[int],
    sql: str,
    *,
    shard_count: int,
    token: str | None,
    tls: ClientTls | None,
    notes: TextIO,
) -> pa.Table:
    """`sql` run once on each node leading one of `shards`, results concatenated in shard
    order (an aggregate yields one row per leader node). A node leading several shards keeps
    their buffers as `<pipeline>` and `<pipeline>_shard<N>` (see `hakafka status`): said on
    `notes`. Nodes are asked at their registered Flight URL, verified per `tls` (with it, a
    plain-text URL is an OpsError)."""
    by_node = leaders(coordinator, shards)
    registered = coordinator.nodes()
    tables = []
    for node, led in sorted(by_node.items(), key=lambda item: item[1][0]):
        endpoints = registered.get(node)
        if endpoints is None:
            raise OpsError(f"shard {led[0]}: its leader {node} is not registered")
        others = [s for s in range(shard_count) if s not in led and _leads(coordinator, node, s)]
        if len(led) > 1 or others:
            print(
                f"note: {node} leads shards {sorted(led + others)}; its buffers are named per "
                "shard (QUERY TABLE in `hakafka status`)",
                file=notes,
            )
        try:
            tables.append(remote_query(endpoints.flight, sql, token, tls=tls))
        except PlainTextRefusedError as exc:
            raise OpsError(f"shard {led[0]}: its leader {node}: {exc}") from None
    return pa.concat_tables(tables, promote_options="default")


def _leads(coordinator: Coordinator, node: str, shard: int) -> bool:
    leader = coordinator.leader_of(shard)
    return leader is not None and leader.node == node


def render(table: pa.Table, fmt: str) -> bytes:
    """`table` as a text table, JSON rows, CSV with header, or an Arrow IPC stream."""
    if fmt == "table":
        rows = [list(r.values()) for r in table.to_pylist()]
        text = format_table(table.column_names, rows)
        return f"{text}\n({table.num_rows} rows)\n".encode()
    if fmt == "json":
        return (json.dumps(table.to_pylist(), default=str) + "\n").encode()
    sink = io.BytesIO()
    if fmt == "csv":
        pacsv.write_csv(table, sink)
    else:
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
    return sink.getvalue()
