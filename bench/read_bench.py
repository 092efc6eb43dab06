"""`read_table` over two shards vs the raw floor: one clickhouse-connect query per shard.

Two private ClickHouse fronts (two shards, 1M rows each at the largest size) and a local[2]
SparkRuntime. The Spark read is forced whole by Spark's `noop` sink (every row reaches the
JVM); the baseline runs one `query_arrow` of the whole table per shard, both shards at once
(two threads, as local[2] has two task slots). Prints rows/s and MiB/s (Arrow bytes of the
rows read), the ratio read_table/direct, and read_table's fixed cost (a 1-row table).
About two minutes.
"""

from __future__ import annotations

import random
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa

from chlib import Cluster, TableSpec, ensure_table
from devstack.clickhouse import ClickHouseService
from hakafka.logs import configure as configure_logs
from spark_bridge.reader import read_table
from spark_bridge.runtime import SparkRuntime, SparkSettings

COLUMNS = (
    ("id", "Int64"),
    ("user", "String"),
    ("amount", "Float64"),
    ("_partition", "Int32"),
    ("_offset", "Int64"),
    ("_timestamp", "Int64"),
)
REPEATS = 3
PARTITIONS = 8  # Kafka partitions: shard s holds the partitions p with p % 2 == s


def shard_rows(rows: int, shard: int) -> pa.Table:
    """`rows` rows of the partitions of `shard`."""
    ids = np.arange(rows, dtype=np.int64)
    partition = (ids % (PARTITIONS // 2) * 2 + shard).astype(np.int32)
    return pa.table(
        {
            "id": ids * 2 + shard,
            "user": pa.array([f"user-{i % 9973}" for i in range(rows)]),
            "amount": ids.astype(np.float64) * 0.5,
            "_partition": partition,
            "_offset": ids // (PARTITIONS // 2),
            "_timestamp": ids + 1_700_000_000_000,
        }
    )


def direct(servers: list[ClickHouseService], table: str) -> pa.Table:
    """The whole table of every shard, one query_arrow per shard, the shards at once."""

    def one(server: ClickHouseService) -> pa.Table:
        client = server.client(database="bench")
        try:
            return client.query_arrow(f"SELECT * FROM {table}")
        finally:
            client.close()

    with ThreadPoolExecutor(len(servers)) as pool:
        return pa.concat_tables(pool.map(one, servers))


def main() -> None:
    configure_logs("console", "warning")
    root = Path(tempfile.mkdtemp(prefix="read-bench-"))
    servers = [ClickHouseService(root / f"ch{s}") for s in range(2)]
    runtime = SparkRuntime(SparkSettings(app_name="read-bench"))
    try:
        for server in servers:
            server.start()
            admin = server.client()
            admin.command("CREATE DATABASE bench")
            admin.close()
        spark = runtime.start()
        cluster = Cluster.from_hosts([[(s.host, s.port)] for s in servers])
        print(f"{'rows':>9} {'path':<11} {'seconds':>8} {'rows/s':>12} {'MiB/s':>8} {'ratio':>6}")
        for per_shard in (1, 100_000, 1_000_000):
            table = f"t{per_shard}"
            for shard, server in enumerate(servers):
                client = server.client(database="bench")
                spec = TableSpec("bench", table, COLUMNS, partition_by="_partition")
                ensure_table(client, spec)
                client.insert_arrow(table, shard_rows(per_shard, shard))
                client.close()
            rows = 2 * per_shard
            direct_times, spark_times = [], []
            for i in range(REPEATS):
                started = time.perf_counter()
                got = direct(servers, table)
                direct_times.append(time.perf_counter() - started)
                assert got.num_rows == rows, got.num_rows
                started = time.perf_counter()
                df = read_table(
                    spark, table, cluster=cluster, database="bench", rng=random.Random(i)
                )
                df.write.format("noop").mode("overwrite").save()
                spark_times.append(time.perf_counter() - started)
            assert df.count() == rows
            mib = got.nbytes / 2**20
            d, s = min(direct_times), min(spark_times)
            print(
                f"{rows:>9} {'direct':<11} {d:>8.3f} {rows / d:>12,.0f} {mib / d:>8.1f} {1:>6.2f}"
            )
            print(
                f"{rows:>9} {'read_table':<11} {s:>8.3f} {rows / s:>12,.0f} {mib / s:>8.1f}"
                f" {d / s:>6.2f}"
            )
            if per_shard == 1:
                print(
                    f"fixed cost of a read_table over 2 shards (1 row each): median"
                    f" {statistics.median(spark_times) * 1000:.0f} ms"
                    f" (direct {statistics.median(direct_times) * 1000:.0f} ms)"
                )
        print(
            f"best of {REPEATS} runs; 2 shards, each its own ClickHouse front; ratio ="
            " read_table throughput / direct query_arrow (one per shard, in parallel) throughput"
        )
    finally:
        runtime.stop()
        for server in servers:
            server.stop()


if __name__ == "__main__":
    main()
