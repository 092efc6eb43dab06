"""`hakafka query`: SQL over the memory buffers of shard leaders, routed via ZooKeeper."""

from __future__ import annotations

import io
import json
from collections.abc import Sequence

import pyarrow as pa
import pyarrow.csv as pacsv

from buffer.client import query as remote_query
from hakafka.coordination import Coordinator
from hakafka.ops.cluster import OpsError, format_table


def leader_flight(coordinator: Coordinator, shard: int) -> str:
    """The Flight URL of `shard`'s current leader; OpsError if it has none."""
    leader = coordinator.leader_of(shard)
    if leader is None:
        raise OpsError(f"shard {shard} has no leader right now; try again or see `hakafka status`")
    node = coordinator.nodes().get(leader.node)
    if node is None:
        raise OpsError(f"shard {shard}: its leader {leader.node} is not registered")
    return node.flight


def query_shards(
    coordinator: Coordinator, shards: Sequence[int], sql: str, token: str | None
) -> pa.Table:
    """`sql` run on each shard's leader, results concatenated in shard order (an aggregate
    therefore yields one row per shard)."""
    tables = [remote_query(leader_flight(coordinator, s), sql, token) for s in shards]
    return pa.concat_tables(tables, promote_options="default")


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
