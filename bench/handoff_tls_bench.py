"""The flush's slice handoff over TLS next to plain gRPC (#34), with the raw floor: a direct
clickhouse-connect insert_arrow of the same block.

Flushes a 1M-row block (2 tasks of 500k rows; best of 3, the three paths interleaved) and a
1-row block (medians over interleaved pairs, after a warm-up) through one local[2]
SparkRuntime, the handoff serving plain `grpc` or `grpc+tls` with an ECDSA P-256 certificate
of a private CA that the tasks are sent with the job. Every table is counted afterwards:
nothing lost or doubled. About half a minute.
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path

from flush_bench import COLUMNS, REPEATS, best, direct_insert, make_table, spark_flush

from chlib import Replica, TableSpec, ensure_table
from devstack.clickhouse import ClickHouseService
from devstack.tls import make_certificates
from hakafka.logs import configure as configure_logs
from spark_bridge.handoff import HandoffOptions, HandoffTls
from spark_bridge.runtime import SparkRuntime, SparkSettings

ROWS = 1_000_000
TINY_WARM_UP = 20  # 1-row flushes per path before any is counted
TINY_PAIRS = 40


def main() -> None:
    configure_logs("console", "warning")  # the table only, not every flush.written
    root = Path(tempfile.mkdtemp(prefix="handoff-tls-bench-"))
    certs = make_certificates(root / "tls")
    paths = {
        "plain": HandoffOptions(),
        "tls": HandoffOptions(tls=HandoffTls(certs.cert_file, certs.key_file, certs.ca_file)),
    }
    ch = ClickHouseService(root / "ch")
    ch.start()
    runtime = SparkRuntime(SparkSettings(app_name="handoff-tls-bench"))
    try:
        spark = runtime.start()
        client = ch.client(compress=False)  # as the flush inserts on loopback
        client.command("CREATE DATABASE bench")
        replica = Replica("local", ch.host, ch.port, local=True)
        for name in ("direct", *paths, *(f"{path}_tiny" for path in paths)):
            ensure_table(client, TableSpec("bench", name, COLUMNS))

        table = make_table(ROWS)
        mib = table.nbytes / 2**20
        seconds: dict[str, list[float]] = {"direct": [], **{path: [] for path in paths}}
        for run in range(REPEATS):
            seconds["direct"].append(direct_insert(client, "direct", table, run))
            for path, handoff in paths.items():
                seconds[path].append(spark_flush(spark, replica, path, table, run, handoff=handoff))
        direct = best(seconds["direct"])
        print(f"{'rows':>9} {'path':<14} {'seconds':>8} {'rows/s':>12} {'MiB/s':>8} {'ratio':>6}")
        for path, samples in seconds.items():
            took = best(samples)
            label = path if path == "direct" else f"{path} handoff"
            print(
                f"{ROWS:>9} {label:<14} {took:>8.3f} {ROWS / took:>12,.0f} {mib / took:>8.1f}"
                f" {direct / took:>6.2f}"
            )
        print(f"  tls / plain flush time: {best(seconds['tls']) / best(seconds['plain']):.2f}")

        tiny = make_table(1)
        times: dict[str, list[float]] = {path: [] for path in paths}
        for run in range(TINY_WARM_UP + TINY_PAIRS):
            # Alternate which path goes first, so neither always follows the other.
            order = list(paths) if run % 2 == 0 else list(reversed(paths))
            for path in order:
                took = spark_flush(spark, replica, f"{path}_tiny", tiny, run, handoff=paths[path])
                times[path].append(took * 1000)
        floor = direct_insert(client, "direct", tiny, REPEATS) * 1000
        median = {path: statistics.median(t[TINY_WARM_UP:]) for path, t in times.items()}
        print(
            f"1-row flush, median of {TINY_PAIRS} interleaved pairs after {TINY_WARM_UP} each"
            f" (direct 1-row insert {floor:.0f} ms):"
        )
        for path, ms in median.items():
            counted = times[path][TINY_WARM_UP:]
            print(
                f"  {path + ' handoff':<14} median {ms:>5.1f} ms, min {min(counted):>5.1f} ms,"
                f" max {max(counted):>6.1f} ms"
            )
        print(f"  tls - plain: {median['tls'] - median['plain']:+.1f} ms per flush")

        for name, expected in {
            "direct": ROWS * REPEATS + 1,
            **{path: ROWS * REPEATS for path in paths},
            **{f"{path}_tiny": TINY_WARM_UP + TINY_PAIRS for path in paths},
        }.items():
            count = client.query(f"SELECT count() FROM bench.{name}").result_rows[0][0]
            assert count == expected, (name, count, expected)
        print(f"best of {REPEATS} runs; ratio = throughput / direct insert_arrow throughput")
    finally:
        runtime.stop()
        ch.stop()


if __name__ == "__main__":
    main()
