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
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from chlib import Replica, TableSpec, ensure_table
from devstack.clickhouse import ClickHouseService
from hakafka.logs import configure as configure_logs
from spark_bridge.flush import FlushTarget, flush_block
from spark_bridge.handoff import HandoffOptions
from spark_bridge.runtime import SparkRuntime, SparkSettings

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client
    from pyspark.sql import SparkSession

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
# 1-row flushes in a row, as a daemon flushing once a second makes them in two minutes. The
# JVM's scheduling path keeps getting faster over the first minute, so the figure is given for
# a new leader (flushes 11-30) and for a running daemon (61-120): medians over enough flushes
# to hold on a noisy machine.
TINY_FLUSHES = 120
TINY_NEW = slice(10, 30)
TINY_RUNNING = slice(60, 120)


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


def direct_insert(client: Client, name: str, table: pa.Table, run: int) -> float:
    """Seconds of one direct `insert_arrow` of `table` into bench.`name`, its own token."""
    started = time.perf_counter()
    client.insert_arrow(
        name, table, database="bench", settings={"insert_deduplication_token": f"direct:{run}"}
    )
    return time.perf_counter() - started


def spark_flush(
    spark: SparkSession,
    replica: Replica,
    name: str,
    table: pa.Table,
    run: int,
    *,
    handoff: HandoffOptions | None = None,
) -> float:
    """Seconds of one `flush_block` of `table` into bench.`name`, its slices handed off as
    `handoff` says (default: plain gRPC, an ephemeral port). Tokens derive from the
    pipeline and the block's offsets: a pipeline per run and table, or ClickHouse would
    rightly drop the repeats as duplicates."""
    target = FlushTarget(
        "bench", name, (replica,), f"{name}-{run}", handoff=handoff or HandoffOptions()
    )
    started = time.perf_counter()
    result = flush_block(spark, Block(f"{name}-{run}", table), target)
    took = time.perf_counter() - started
    assert result.rows == table.num_rows, (name, result.rows)
    return took


def tiny_flushes(
    spark: SparkSession, client: Client, replica: Replica, name: str, count: int
) -> list[float]:
    """Seconds of each of `count` flushes of a 1-row block into bench.`name`, in order."""
    ensure_table(client, TableSpec("bench", name, COLUMNS))
    tiny = make_table(1)
    return [spark_flush(spark, replica, name, tiny, run) for run in range(count)]


def tiny_row(what: str, window: slice, times: list[float]) -> str:
    """The median, min and max of the flushes of `window` (0-based) of `times`."""
    picked = [t * 1000 for t in times[window]]
    return (
        f"1-row flush, {what} (flushes {window.start + 1}-{window.stop}): median"
        f" {statistics.median(picked):.0f} ms, min {min(picked):.0f} ms, max {max(picked):.0f} ms"
    )


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
                direct.append(direct_insert(client, f"direct_{rows}", table, i))
                spark_times.append(spark_flush(spark, replica, f"spark_{rows}", table, i))
            count = client.query(f"SELECT count() FROM bench.spark_{rows}").result_rows[0][0]
            assert count == rows * REPEATS, count
            d, s = best(direct), best(spark_times)
            print(f"{rows:>9} {'direct':<8} {d:>8.3f} {rows / d:>12,.0f} {mib / d:>8.1f} {1:>6.2f}")
            print(
                f"{rows:>9} {'spark':<8} {s:>8.3f} {rows / s:>12,.0f} {mib / s:>8.1f} {d / s:>6.2f}"
            )
        tiny = tiny_flushes(spark, client, replica, "tiny", TINY_FLUSHES)
        floor = direct_insert(client, "tiny", make_table(1), 0)
        print(f"fixed overhead per flush (direct 1-row insert {floor * 1000:.0f} ms):")
        print(tiny_row("a new leader", TINY_NEW, tiny))
        print(tiny_row("a running daemon", TINY_RUNNING, tiny))
        print(f"best of {REPEATS} runs; ratio = spark throughput / direct insert_arrow throughput")
    finally:
        runtime.stop()
        ch.stop()


if __name__ == "__main__":
    main()
