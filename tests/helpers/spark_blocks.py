"""Blocks for `spark_bridge.flush.flush_block` and the ClickHouse tables and replicas they go to, as
the Spark flush tests build them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from chlib import Replica, TableSpec
from devstack.clickhouse import ClickHouseService

# The columns of a block from `make_block` and of its table from `spec`.
COLUMNS = (("v", "Int64"), ("name", "String"), ("_partition", "Int32"), ("_offset", "Int64"))


@dataclass
class Block:
    """A sealed block as `flush_block` takes it: an id and its rows."""

    block_id: str
    table: pa.Table

    def to_table(self) -> pa.Table:
        return self.table


def make_block(rows: int, block_id: str = "b1", *, seed: int = 0, start: int = 0) -> Block:
    """Values ``start .. start+rows-1`` over 4 Kafka partitions, in a shuffled order: the
    same rows for every `seed`, in another order (`_offset` is the value // 4)."""
    import numpy as np

    order = np.random.default_rng(seed).permutation(rows) + start
    offsets = pa.array(order // 4, pa.int64())
    table = pa.table(
        {
            "v": pa.array(order, pa.int64()),
            "name": pa.array([f"n{i % 13}" for i in order.tolist()]),
            "_partition": pa.array(order % 4, pa.int32()),
            "_offset": offsets,
        }
    )
    return Block(block_id, table)


def spec(database: str, table: str = "events", columns: Any = COLUMNS) -> TableSpec:
    """The table `database`.`table` with `columns`, ordered by (`_partition`, `_offset`)."""
    return TableSpec(database, table, tuple(columns), order_by="(_partition, _offset)")


def replica(ch: ClickHouseService, name: str = "r1", **kw: Any) -> Replica:
    """The ClickHouse front `ch` as the flush target's replica `name`."""
    return Replica(name, ch.host, ch.port, **kw)
