"""read_table over a cluster: two real ClickHouse servers as two shards (or as two replicas of
one), real Spark; a replica under replacement, a replica killed mid-read, and the live buffer
above a checkpoint."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from chlib import Cluster, Replica, ShardReplicas, TableSpec, ensure_table
from devstack.clickhouse import ClickHouseService
from spark_bridge.reader import read_table

pytestmark = [pytest.mark.integration, pytest.mark.spark]

COLUMNS = (("v", "Int64"), ("_partition", "Int32"), ("_offset", "Int64"))


def create(ch: ClickHouseService, database: str) -> Any:
    client = ch.client(database=database)
    ensure_table(
        client,
        TableSpec(
            database, "events", COLUMNS, order_by="(_partition, _offset)", partition_by="_partition"
        ),
    )
    return client


def rows_of(partitions: list[int], offsets: range, tag: int = 0) -> pa.Table:
    """Every offset of `offsets` in each partition; `v` = tag + partition * 1e6 + offset."""
    pairs = [(p, o) for p in partitions for o in offsets]
    return pa.table(
        {
            "v": pa.array([tag + p * 1_000_000 + o for p, o in pairs], pa.int64()),
            "_partition": pa.array([p for p, _ in pairs], pa.int32()),
            "_offset": pa.array([o for _, o in pairs], pa.int64()),
        }
    )


def pairs(df: Any) -> list[tuple[int, int]]:
    return sorted((r._partition, r._offset) for r in df.collect())


def hosts(ch: ClickHouseService) -> tuple[str, int]:
    return (ch.host, ch.port)


def queries_running(port: int) -> int:
    """Established TCP connections to 127.0.0.1:`port` (Linux: /proc/net/tcp)."""
    lines = Path("/proc/net/tcp").read_text().splitlines()[1:]
    return sum(
        1
        for line in lines
        if (fields := line.split())[1].endswith(f":{port:04X}") and fields[3] == "01"
    )


def kill_during_a_long_query(server: ClickHouseService, killed: list[bool]) -> None:
    """Kill `server` once a connection to it stayed open 0.3 s (a query, not the planning's
    quick ones); give up after 20 s."""
    deadline = time.monotonic() + 20
    held = 0
    while time.monotonic() < deadline:
        held = held + 1 if queries_running(server.port) else 0
        if held >= 6:
            server.kill()
            killed.append(True)
            return
        time.sleep(0.05)


class FirstReplica(random.Random):
    """A read order that always starts at each shard's first listed replica."""

    def randrange(self, *_args: Any, **_kwargs: Any) -> int:
        return 0


def test_two_shards_are_read_once_each_and_their_union_comes_back(
    spark: SparkSession,
    clickhouse: ClickHouseService,
    clickhouse2: ClickHouseService,
    ch_database2: str,
) -> None:
    # Shard 0 holds partitions 0 and 2, shard 1 partitions 1 and 3: 4 x 5000 rows.
    create(clickhouse, ch_database2).insert_arrow("events", rows_of([0, 2], range(5000)))
    create(clickhouse2, ch_database2).insert_arrow("events", rows_of([1, 3], range(5000)))
    cluster = Cluster.from_hosts([[hosts(clickhouse)], [hosts(clickhouse2)]])

    df = read_table(spark, "events", cluster=cluster, database=ch_database2)
    assert df.rdd.getNumPartitions() == 4  # two ClickHouse partitions per shard
    assert pairs(df) == [(p, o) for p in range(4) for o in range(5000)]

    ranged = read_table(
        spark,
        "events",
        cluster=cluster,
        database=ch_database2,
        partition_by="_offset",
        partitions=3,
        lower_bound=1000,
        upper_bound=3999,
    )
    assert ranged.rdd.getNumPartitions() == 6  # 3 ranges per shard; the outer ones open
    assert pairs(ranged) == [(p, o) for p in range(4) for o in range(5000)]
    assert ranged.filter("v >= 3000000").count() == 5000  # pushed down to both shards


def test_a_replica_under_replacement_is_never_read(
    spark: SparkSession,
    clickhouse: ClickHouseService,
    clickhouse2: ClickHouseService,
    ch_database2: str,
) -> None:
    # Two replicas of one shard, told apart by `v`: the one under replacement is behind.
    create(clickhouse, ch_database2).insert_arrow("events", rows_of([0], range(100)))
    create(clickhouse2, ch_database2).insert_arrow("events", rows_of([0], range(100), tag=7))

    def read(replacing: bool, seed: int) -> set[int]:
        cluster = Cluster(
            (
                ShardReplicas(
                    0,
                    (
                        Replica("n1", clickhouse.host, clickhouse.port),
                        Replica("n2", clickhouse2.host, clickhouse2.port, writable=not replacing),
                    ),
                ),
            )
        )
        df = read_table(
            spark, "events", cluster=cluster, database=ch_database2, rng=random.Random(seed)
        )
        return {r.v % 1_000_000 - r._offset for r in df.collect()}

    assert set().union(*(read(False, seed) for seed in range(6))) == {0, 7}, "reads spread"
    assert set().union(*(read(True, seed) for seed in range(6))) == {0}


def test_a_replica_that_dies_mid_read_is_replaced_by_its_peer(
    spark: SparkSession,
    clickhouse: ClickHouseService,
    ch_database: str,
    tmp_path: Path,
) -> None:
    doomed = ClickHouseService(tmp_path / "doomed")
    doomed.start()
    try:
        admin = doomed.client()
        admin.command(f"CREATE DATABASE `{ch_database}`")
        admin.close()
        for server in (doomed, clickhouse):
            create(server, ch_database).insert_arrow("events", rows_of([0], range(1000)))
        cluster = Cluster.from_hosts([[hosts(doomed), hosts(clickhouse)]])
        # 2 ms per row: a 2 s query, the doomed replica killed 0.3 s into it.
        slow = "sleepEachRow(0.002) = 0"
        df = read_table(
            spark, "events", cluster=cluster, database=ch_database, where=slow, rng=FirstReplica()
        )
        killed: list[bool] = []
        killer = threading.Thread(target=kill_during_a_long_query, args=(doomed, killed))
        killer.start()
        got = pairs(df)
        killer.join(timeout=30)
        assert killed == [True] and doomed.pid is None, "the replica died during its query"
        assert got == [(0, o) for o in range(1000)]
    finally:
        doomed.stop()


@dataclass
class FixedBuffer:
    """A live buffer answering fixed rows and checkpoint, recording the order of the calls."""

    buffered: pa.Table
    committed: Mapping[int, int]
    calls: list[str]

    def rows(self) -> pa.Table:
        self.calls.append("rows")
        return self.buffered

    def checkpoint(self) -> Mapping[int, int]:
        self.calls.append("checkpoint")
        return self.committed


@pytest.fixture
def buffered_shards(
    clickhouse: ClickHouseService, clickhouse2: ClickHouseService, ch_database2: str
) -> Iterator[Cluster]:
    # Checkpoint {0: 80, 1: 60}; ClickHouse also has an uncommitted flush above it (p0 80..99)
    # and the buffer still has a committed block below it (p0 50..79) and p1's new rows.
    create(clickhouse, ch_database2).insert_arrow("events", rows_of([0], range(100)))
    create(clickhouse2, ch_database2).insert_arrow("events", rows_of([1], range(60)))
    yield Cluster.from_hosts([[hosts(clickhouse)], [hosts(clickhouse2)]])


def test_include_buffer_adds_the_rows_above_the_checkpoint_each_once(
    spark: SparkSession, buffered_shards: Cluster, ch_database2: str
) -> None:
    buffer = pa.concat_tables(
        [rows_of([0], range(50, 130)), rows_of([1], range(60, 75)), rows_of([5], range(3))]
    ).append_column("_shard", pa.array([0] * 98, pa.int32()))
    calls: list[str] = []
    live = FixedBuffer(buffer, {0: 80, 1: 60}, calls)
    cluster = Cluster(buffered_shards.shards, live)

    df = read_table(spark, "events", cluster=cluster, database=ch_database2, include_buffer=True)
    assert calls == ["rows", "checkpoint"], "the buffers are read before the checkpoint"
    assert df.columns == ["v", "_partition", "_offset"]
    expected = (
        [(0, o) for o in range(130)] + [(1, o) for o in range(75)] + [(5, o) for o in range(3)]
    )
    assert pairs(df) == expected

    without = read_table(spark, "events", cluster=cluster, database=ch_database2)
    assert without.count() == 160, "without include_buffer: ClickHouse as it is"
    with pytest.raises(ValueError, match="filter the DataFrame instead"):
        read_table(
            spark,
            "events",
            cluster=cluster,
            database=ch_database2,
            include_buffer=True,
            where="v > 0",
        )
    with pytest.raises(ValueError, match="include_buffer needs a cluster with"):
        read_table(
            spark, "events", cluster=buffered_shards, database=ch_database2, include_buffer=True
        )
