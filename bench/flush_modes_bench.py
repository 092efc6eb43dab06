"""Flush throughput per Spark mode: local in the process, a standalone cluster, Spark Connect,
next to a direct clickhouse-connect insert_arrow of the same block (the floor).

Starts a private ClickHouse front, a standalone master + worker and a Spark Connect server
(`devstack.spark_cluster`, PySpark's jars), each Spark with 2 cores; flushes the same 100k and
1M-row blocks through each (`flush_block`, default 500k rows per task), best of 3, and the
fixed cost of a 1-row block. Every mode's table is counted afterwards: nothing lost or doubled.
Each mode runs in a process of its own, as in a daemon: a process has one Spark driver JVM,
whose settings are fixed when it starts. About two minutes.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import clickhouse_connect
from flush_bench import (
    COLUMNS,
    REPEATS,
    direct_insert,
    make_table,
    spark_flush,
    tiny_flushes,
)

from chlib import Replica, TableSpec, ensure_table
from devstack.clickhouse import ClickHouseService
from devstack.spark_cluster import SparkConnectServer, SparkStandalone
from hakafka.logs import configure as configure_logs
from spark_bridge.runtime import SparkRuntime, SparkSettings

SIZES = (100_000, 1_000_000)


def row(rows: int, path: str, seconds: float, mib: float, direct: float) -> str:
    """One line: throughput, and `ratio` = its throughput / the direct insert's."""
    rate, mib_s, ratio = rows / seconds, mib / seconds, direct / seconds
    return f"{rows:>9} {path:<11} {seconds:>8.3f} {rate:>12,.0f} {mib_s:>8.1f} {ratio:>6.2f}"


def run_mode(mode: str, url: str, ch_port: int, direct: dict[int, float]) -> None:
    """Child process: flush every size through `mode` at `url` and print its lines."""
    configure_logs("console", "warning")  # the table only, not every flush.written
    settings = {
        "local": SparkSettings(app_name="bench-local"),
        # The same 2 cores as local[2] and the Connect server's local[2].
        "standalone": SparkSettings(
            master=url, app_name="bench-standalone", conf={"spark.cores.max": "2"}
        ),
        "connect": SparkSettings(remote=url, app_name="bench-connect"),
    }[mode]
    replica = Replica("local", "127.0.0.1", ch_port, local=True)
    client = clickhouse_connect.get_client(host="127.0.0.1", port=ch_port, interface="http")
    runtime = SparkRuntime(settings)
    try:
        started = time.perf_counter()
        spark = runtime.start()
        session_s = time.perf_counter() - started
        for rows in SIZES:
            table, name = make_table(rows), f"{mode}_{rows}"
            ensure_table(client, TableSpec("bench", name, COLUMNS))
            samples = [spark_flush(spark, replica, name, table, i) for i in range(REPEATS)]
            count = client.query(f"SELECT count() FROM bench.{name}").result_rows[0][0]
            assert count == rows * REPEATS, (name, count)
            print(row(rows, mode, min(samples), table.nbytes / 2**20, direct[rows]))
        flushes = tiny_flushes(spark, client, replica, f"tiny_{mode}", 5)
        print(
            f"  {mode:<11} {statistics.median(flushes) * 1000:>6.0f} ms per flush,"
            f" session start {session_s:.1f} s",
            file=sys.stderr,
        )
    finally:
        runtime.stop()


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="flush-modes-bench-"))
    ch = ClickHouseService(root / "ch")
    standalone = SparkStandalone(root / "standalone")
    connect = SparkConnectServer(root / "connect")
    began = time.perf_counter()
    try:
        ch.start()
        standalone.start()
        connect.start()
        print(
            f"cluster start: standalone + Connect server up in {time.perf_counter() - began:.0f} s"
        )
        # The baseline inserts as the flush does on loopback: uncompressed.
        client = ch.client(compress=False)
        client.command("CREATE DATABASE bench")
        direct: dict[int, float] = {}
        print(f"{'rows':>9} {'path':<11} {'seconds':>8} {'rows/s':>12} {'MiB/s':>8} {'ratio':>6}")
        for rows in SIZES:
            table = make_table(rows)
            ensure_table(client, TableSpec("bench", f"direct_{rows}", COLUMNS))
            direct[rows] = min(
                direct_insert(client, f"direct_{rows}", table, i) for i in range(REPEATS)
            )
            print(row(rows, "direct", direct[rows], table.nbytes / 2**20, direct[rows]), flush=True)
        costs = []
        for mode, url in (("local", ""), ("standalone", standalone.url), ("connect", connect.url)):
            child = subprocess.run(
                [sys.executable, __file__, mode, url, str(ch.port), json.dumps(direct)],
                capture_output=True,
                text=True,
                timeout=600,
                check=False,
            )
            if child.returncode != 0:
                raise RuntimeError(f"{mode}: exit {child.returncode}\n{child.stderr[-3000:]}")
            print(child.stdout, end="", flush=True)
            costs += [line for line in child.stderr.splitlines() if " ms per flush," in line]
        print("fixed cost per flush (1-row block), median of 5; session start once per daemon:")
        print("\n".join(costs))
        print(
            f"best of {REPEATS} runs; ratio = mode throughput / direct insert_arrow throughput;"
            " standalone: one worker JVM, its executor a third JVM; connect: the server's local[2]"
        )
    finally:
        connect.stop()
        standalone.stop()
        ch.stop()


if __name__ == "__main__":
    if len(sys.argv) > 1:
        mode, url, port, direct = sys.argv[1:]
        run_mode(mode, url, int(port), {int(k): v for k, v in json.loads(direct).items()})
    else:
        main()
