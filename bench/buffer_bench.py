"""Memory buffer: append throughput and query latency, next to raw baselines from the same run.

Append: MemoryTable.append of 10k-row batches (validation, offset checks, accounting) against a
plain list.append of the same batches (the floor).
Query: p50/p99 over 1M buffered rows for count(*), a GROUP BY on a low-cardinality string and
a filtered avg; directly (SqlEngine.query: snapshot + sandboxed cursor), through Arrow Flight
(one persistent client) and HTTP (buffer.client.query, Arrow IPC), next to the same DuckDB
query on the same Arrow table in-process (the floor). Target: Flight adds < 5 ms p50.

Run: .venv/bin/python bench/buffer_bench.py
"""

from __future__ import annotations

import functools
import statistics
import threading
import time
from collections.abc import Callable

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.flight as fl

from buffer import Catalog, MemoryTable, OffsetRange, QueryLimits, SqlEngine
from buffer.client import query as client_query
from buffer.flight import FlightQueryServer
from buffer.http import HttpQueryServer

BATCH_ROWS = 10_000
BATCHES = 100  # 1M rows
PARTITIONS = 4
APPEND_ROUNDS = 30
QUERY_RUNS = 80
WARMUP = 3
THREADS = 2
KINDS = pa.array(["click", "view", "buy", "cart", "search", "share", "like", "login"])
QUERIES = {
    "count(*)": "SELECT count(*) FROM events",
    "group by kind": "SELECT kind, count(*), sum(user_id) FROM events GROUP BY kind ORDER BY kind",
    "filtered avg": "SELECT avg(amount) FROM events WHERE kind = 'buy' AND user_id % 10 = 3",
}
Ranges = dict[tuple[str, int], OffsetRange]


def make_batches() -> list[tuple[pa.RecordBatch, Ranges]]:
    """BATCHES batches, round-robin over PARTITIONS, offsets contiguous per partition."""
    seq = pa.array(range(BATCH_ROWS), pa.int64())
    out = []
    for i in range(BATCHES):
        part, first = i % PARTITIONS, (i // PARTITIONS) * BATCH_ROWS
        offsets = pc.add(seq, first)
        batch = pa.record_batch(
            {
                "_topic": pa.array(["events"] * BATCH_ROWS),
                "_partition": pa.array([part] * BATCH_ROWS, pa.int32()),
                "_offset": offsets,
                "kind": pc.take(KINDS, pc.bit_wise_and(pc.multiply(offsets, 2654435761), 7)),
                "user_id": pc.bit_wise_and(pc.multiply(offsets, 40503), 0xFFFF),
                "amount": pc.divide(pc.cast(pc.bit_wise_and(offsets, 1023), pa.float64()), 7.0),
            }
        )
        out.append((batch, {("events", part): OffsetRange(first, first + BATCH_ROWS - 1)}))
    return out


def best_append_seconds(
    append: Callable[[], Callable[..., None]], batches: list[tuple[pa.RecordBatch, Ranges]]
) -> float:
    """Fastest of APPEND_ROUNDS runs appending every batch into a fresh sink."""
    best = float("inf")
    for _ in range(APPEND_ROUNDS):
        sink = append()
        started = time.perf_counter()
        for batch, ranges in batches:
            sink(batch, ranges)
        best = min(best, time.perf_counter() - started)
    return best


def latencies_ms(paths: dict[str, Callable[[], object]]) -> dict[str, tuple[float, float]]:
    """Per path p50 and p99 in milliseconds over QUERY_RUNS runs after WARMUP; the paths run
    interleaved (rotating order) so load from other processes hits them alike."""
    samples: dict[str, list[float]] = {label: [] for label in paths}
    labels = list(paths)
    for i in range(WARMUP + QUERY_RUNS):
        for label in labels[i % len(labels) :] + labels[: i % len(labels)]:
            started = time.perf_counter()
            paths[label]()
            if i >= WARMUP:
                samples[label].append((time.perf_counter() - started) * 1000)
    return {
        label: (statistics.median(s), statistics.quantiles(s, n=100, method="inclusive")[98])
        for label, s in samples.items()
    }


def main() -> None:
    batches = make_batches()
    schema = batches[0][0].schema
    rows = BATCHES * BATCH_ROWS
    nbytes = sum(b.get_total_buffer_size() for b, _ in batches)
    print(
        f"buffer bench: {rows:,} rows in {BATCHES} batches of {BATCH_ROWS:,} "
        f"({nbytes / 2**20:.1f} MiB), pyarrow {pa.__version__}, duckdb {duckdb.__version__}, "
        f"{THREADS} DuckDB threads"
    )

    def fresh_table() -> Callable[..., None]:
        return MemoryTable("events", schema, limit_bytes=1 << 40).append

    def fresh_list() -> Callable[..., None]:
        held: list[tuple[pa.RecordBatch, Ranges]] = []
        return lambda batch, ranges: held.append((batch, ranges))

    raw = best_append_seconds(fresh_list, batches)
    table_s = best_append_seconds(fresh_table, batches)
    print(f"\nappend (best of {APPEND_ROUNDS} rounds)   M rows/s        MiB/s   ratio")
    for label, secs in (("list.append (floor)", raw), ("MemoryTable.append", table_s)):
        print(
            f"  {label:<26} {rows / secs / 1e6:>10,.1f} {nbytes / 2**20 / secs:>12,.0f} "
            f"{raw / secs:>7.3f}"
        )
    print(f"  per append: {table_s / BATCHES * 1e6:.1f} us (floor {raw / BATCHES * 1e6:.2f} us)")

    table = MemoryTable("events", schema, limit_bytes=1 << 40)
    for batch, ranges in batches:
        table.append(batch, ranges)
    catalog = Catalog()
    catalog.add(table)
    engine = SqlEngine(catalog, QueryLimits(timeout_s=60, threads=THREADS, memory_bytes=2 << 30))
    floor_db = duckdb.connect(":memory:", config={"threads": THREADS})
    floor_db.register("events", table.snapshot().to_table())
    flight = FlightQueryServer(engine)
    flight_thread = threading.Thread(target=flight.serve, daemon=True)
    flight_thread.start()
    http = HttpQueryServer(engine)
    http.start()
    flight_client = fl.connect(flight.location)

    def floor_query(sql: str) -> pa.Table:
        return floor_db.sql(sql).to_arrow_table()

    def flight_query(sql: str) -> pa.Table:
        return flight_client.do_get(fl.Ticket(sql.encode())).read_all()

    try:
        print(f"\nquery latency ms over {QUERY_RUNS} runs     p50      p99   p50 - floor")
        worst_flight = 0.0
        for name, sql in QUERIES.items():
            expected = floor_db.sql(sql).to_arrow_table()
            paths: dict[str, Callable[[], pa.Table]] = {
                "duckdb in-process (floor)": functools.partial(floor_query, sql),
                "direct SqlEngine.query": functools.partial(engine.query, sql),
                "Arrow Flight do_get": functools.partial(flight_query, sql),
                "HTTP /query (arrow)": functools.partial(client_query, http.url, sql),
            }
            for label, run in paths.items():
                assert run().equals(expected), (label, name)
            print(f"  {name}")
            figures = latencies_ms(paths)
            floor_p50 = figures["duckdb in-process (floor)"][0]
            worst_flight = max(worst_flight, figures["Arrow Flight do_get"][0] - floor_p50)
            for label, (p50, p99) in figures.items():
                print(f"    {label:<30} {p50:>7.2f} {p99:>8.2f} {p50 - floor_p50:>+10.2f}")
        verdict = "met" if worst_flight < 5 else "NOT met"
        print(
            f"\nFlight p50 overhead over the floor: at most {worst_flight:+.2f} ms "
            f"(target < 5 ms: {verdict})"
        )
    finally:
        flight_client.close()
        http.close()
        flight.shutdown()
        flight_thread.join(timeout=10)
        engine.close()
        floor_db.close()


if __name__ == "__main__":
    main()
