"""Spark flush vs the raw floor: direct clickhouse-connect insert_arrow of the same block.

Prints rows/s and MiB/s for 100k and 1M rows, the ratio Spark/direct, and the fixed
per-flush overhead (a 1-row block). Runs a private ClickHouse front and a local[2]
SparkRuntime; about a minute.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from devstack.clickhouse import ClickHouseService
from hakafka.logs import configure as configure_logs
from spark_bridge import (
    FlushTarget,
    Replica,
    SparkRuntime,
    SparkSettings,
    TableSpec,
    ensure_table,
    flush_block,
)

COLUMNS = (
    ("id", "Int64"),
    ("user", "String"),
    ("amount", "Float64"),
    ("_topic", "String"),
    ("_partition", "Int32"),
    ("_offset", "Int64"),
    ("_timestamp", "Int64"),
)
REPEATS = 3
TINY_REPEATS = 21  # 1-row flushes: a median over enough of them to hold on a noisy machine
TINY_WARM_UP = 10


@dataclass
class Block:
    block_id: str
    table: pa.Table

    def to_table(self) -> pa.Table:
        return self.table


def make_table(rows: int) -> pa.Table:
    ids = np.arange(rows, dtype=np.int64)
    return pa.table(
        {
            "id": ids,
            "user": pa.array([f"user-{i % 9973}" for i in range(rows)]),
            "amount": ids.astype(np.float64) * 0.5,
            "_topic": pa.array(["events"] * rows),
            "_partition": (ids % 8).astype(np.int32),
            "_offset": ids // 8,
            "_timestamp": ids + 1_700_000_000_000,
        }
    )


def best(samples: list[float]) -> float:
    return min(samples)


def main() -> None:
    configure_logs("console", "warning")  # the table only, not every flush.written
    root = Path(tempfile.mkdtemp(prefix="flush-bench-"))
    ch = ClickHouseService(root / "ch")
    ch.start()
    runtime = SparkRuntime(SparkSettings(app_name="flush-bench"))
    try:
        spark = runtime.start()
        # The baseline inserts as the flush does on loopback: uncompressed.
        client = ch.client(compress=False)
        client.command("CREATE DATABASE bench")
        replica = Replica("local", ch.host, ch.port, local=True)
        print(f"{'rows':>9} {'path':<8} {'seconds':>8} {'rows/s':>12} {'MiB/s':>8} {'ratio':>6}")
        for rows in (100_000, 1_000_000):
            table = make_table(rows)
            mib = table.nbytes / 2**20
            for name in ("direct", "spark"):
                ensure_table(client, TableSpec("bench", f"{name}_{rows}", COLUMNS))
            direct, spark_times = [], []
            for i in range(REPEATS):
                started = time.perf_counter()
                client.insert_arrow(
                    f"direct_{rows}",
                    table,
                    database="bench",
                    settings={"insert_deduplication_token": f"direct:{rows}:{i}"},
                )
                direct.append(time.perf_counter() - started)
                # Tokens derive from the pipeline and the block's offsets: a pipeline per
                # repeat, or ClickHouse would rightly drop the repeats as duplicates.
                target = FlushTarget("bench", f"spark_{rows}", (replica,), f"bench-{i}")
                started = time.perf_counter()
                result = flush_block(spark, Block(f"{rows}-{i}", table), target)
                spark_times.append(time.perf_counter() - started)
                assert result.rows == rows
            count = client.query(f"SELECT count() FROM bench.spark_{rows}").result_rows[0][0]
            assert count == rows * REPEATS, count
            d, s = best(direct), best(spark_times)
            print(f"{rows:>9} {'direct':<8} {d:>8.3f} {rows / d:>12,.0f} {mib / d:>8.1f} {1:>6.2f}")
            print(
                f"{rows:>9} {'spark':<8} {s:>8.3f} {rows / s:>12,.0f} {mib / s:>8.1f} {d / s:>6.2f}"
            )
        ensure_table(client, TableSpec("bench", "tiny", COLUMNS))
        tiny = make_table(1)
        overhead = []
        # The first few warm up the JVM's compiled scheduling path; a daemon runs warm.
        for i in range(TINY_WARM_UP + TINY_REPEATS):
            target = FlushTarget("bench", "tiny", (replica,), f"bench-{i}")
            started = time.perf_counter()
            flush_block(spark, Block(f"tiny-{i}", tiny), target)
            if i >= TINY_WARM_UP:
                overhead.append(time.perf_counter() - started)
        started = time.perf_counter()
        client.insert_arrow("tiny", tiny, database="bench")
        floor = time.perf_counter() - started
        print(
            f"fixed overhead per flush (1-row block, after {TINY_WARM_UP} to warm up): median of"
            f" {TINY_REPEATS} {statistics.median(overhead) * 1000:.0f} ms, min"
            f" {min(overhead) * 1000:.0f} ms, max {max(overhead) * 1000:.0f} ms"
            f" (direct 1-row insert {floor * 1000:.0f} ms)"
        )
        print(f"best of {REPEATS} runs; ratio = spark throughput / direct insert_arrow throughput")
    finally:
        runtime.stop()
        ch.stop()


if __name__ == "__main__":
    main()
