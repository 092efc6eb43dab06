"""Pushes into the buffer (#33), with a real daemon: how many rows a second writers push into a
pipeline's buffer over Flight `do_put` and HTTP `POST /insert` in 10,000-row Arrow batches,
and how long a batch takes to be queryable and to be acknowledged.

One `hakafka run` daemon (n1) leads the one shard of a pipeline on the local stack; its
topic is empty, so every row comes from the writers. WRITERS writer threads in this process
each push 10,000-row batches one after the other (one batch in flight per writer, as the
README asks) for SECONDS seconds through `buffer.push_client.Pusher`. An answer comes once
the batch is flushed to ClickHouse, so a writer's rate is one batch per flush it waits for:
throughput comes from many writers.

Baseline, in the same run: the same writers `do_put` the same batches into a Flight server in
its own process that reads and discards them (the floor of any Flight push on this machine).

Both runs follow a warm-up (three batches pushed and flushed: the first flushes start
Spark's job machinery). Latency: while the load runs, a probe writer pushes a 10-row batch
every PROBE_S s; from the push's start to (a) its rows counted by a query on the leader's
buffer (polled over Flight) and (b) its answer. p50/p99 over the probes.

At the end ClickHouse holds every acknowledged row once (counted per writer and sequence);
otherwise the exit code is 1.

Run: PYTHONPATH=. .venv/bin/python bench/push_bench.py [--writers N] [--seconds S]  (~3 min)
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.flight as fl
from benchstack import local_stack

from buffer.client import query as buffer_query
from buffer.push_client import Pusher
from devstack.cluster import LocalCluster, PipelineSpec
from devstack.records import create_topic

BATCH_ROWS = 10_000
COLUMNS = {"id": "Int64", "kind": "String", "amount": "Float64"}
PROBE_S = 0.5
MIB = 1 << 20


def batch(writer: int, first: int, rows: int = BATCH_ROWS) -> pa.Table:
    ids = pa.array(range(writer * 10**9 + first, writer * 10**9 + first + rows), pa.int64())
    return pa.table(
        {
            "id": ids,
            "kind": pa.array([f"writer-{writer}"] * rows),
            "amount": pc.multiply(ids.cast(pa.float64()), 0.5),
        }
    )


@dataclass
class Load:
    """What the writers of one run pushed and how long each answer took."""

    rows: int = 0
    nbytes: int = 0
    seconds: float = 0.0
    answers: list[float] = field(default_factory=list)
    retried: int = 0  # pushes that took more than one request
    lock: threading.Lock = field(default_factory=threading.Lock)

    def rate(self) -> str:
        return (
            f"{self.rows / self.seconds / 1000:7.1f}k rows/s "
            f"{self.nbytes / self.seconds / MIB:6.1f} MiB/s"
        )


def run_writers(
    writers: int, seconds: float, push: Callable[[int, int, pa.Table], tuple[int, int]]
) -> Load:
    """`writers` threads, each pushing batches as `push(writer, sequence, batch)` (-> rows
    applied, requests it took) until `seconds` passed."""
    load = Load()
    tables = [batch(w, 0) for w in range(writers)]
    deadline = time.monotonic() + seconds

    def write(writer: int) -> None:
        sequence = 0
        while time.monotonic() < deadline:
            began = time.monotonic()
            rows, attempts = push(writer, sequence, tables[writer])
            took = time.monotonic() - began
            with load.lock:
                load.retried += attempts > 1
                load.rows += rows
                load.nbytes += tables[writer].nbytes if rows else 0
                load.answers.append(took)
            sequence += 1

    began = time.monotonic()
    threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    load.seconds = time.monotonic() - began
    return load


class _Discard(fl.FlightServerBase):  # type: ignore[misc]
    def do_put(
        self,
        context: fl.ServerCallContext,
        descriptor: fl.FlightDescriptor,
        reader: fl.MetadataRecordBatchReader,
        writer: fl.FlightMetadataWriter,
    ) -> None:
        rows = sum(chunk.data.num_rows for chunk in reader)
        writer.write(pa.py_buffer(b'{"rows": %d, "duplicate": false}' % rows))


def _serve_discard(pipe: Connection) -> None:
    server = _Discard("grpc://127.0.0.1:0")
    pipe.send(server.port)
    pipe.recv()  # until told to stop
    server.shutdown()


def raw_put(port: int) -> Callable[[int, int, pa.Table], tuple[int, int]]:
    local = threading.local()

    def put(writer: int, sequence: int, table: pa.Table) -> tuple[int, int]:
        if not hasattr(local, "client"):
            local.client = fl.connect(f"grpc://127.0.0.1:{port}")
        descriptor = fl.FlightDescriptor.for_path("events", "0", f"w{writer}", str(sequence))
        put_writer, metadata = local.client.do_put(descriptor, table.schema)
        with put_writer:
            put_writer.write_table(table)
            put_writer.done_writing()
            metadata.read()
        return int(table.num_rows), 1

    return put


def hakafka_push(url: str, tag: str) -> Callable[[int, int, pa.Table], tuple[int, int]]:
    """Each writer's pushes through a `Pusher` of its own, writer id `<tag>-<n>`."""
    pushers: dict[int, Pusher] = {}

    def push(writer: int, sequence: int, table: pa.Table) -> tuple[int, int]:
        pusher = pushers.setdefault(writer, Pusher(lambda: [url], "events", 0, f"{tag}-{writer}"))
        answer = pusher.push(sequence, table)
        return answer.rows, answer.attempts

    return push


def probe(
    leader_flight: str, url: str, tag: str, stop: threading.Event
) -> tuple[list[float], list[float]]:
    """(push -> queryable, push -> answered) seconds of a 10-row batch every PROBE_S s, by
    writer `probe-<tag>`."""
    pusher = Pusher(lambda: [url], "events", 0, f"probe-{tag}")
    visible: list[float] = []
    answered: list[float] = []
    sequence = 0
    while not stop.wait(PROBE_S):
        marker = 9 * 10**12 + sequence * 10
        rows = batch(0, 0, 10).set_column(0, "id", pa.array(range(marker, marker + 10)))
        began = time.monotonic()
        done: list[float] = []
        pushing = threading.Thread(target=_push_noting, args=(pusher, sequence, rows, done))
        pushing.start()
        sql = f"SELECT count(*) AS n FROM events WHERE id = {marker}"
        while buffer_query(leader_flight, sql).column("n")[0].as_py() == 0:
            if done:  # flushed before a poll saw it in the buffer: counts from ClickHouse
                break
            time.sleep(0.005)
        seen = time.monotonic()
        pushing.join(120)
        if done and seen <= done[0]:
            visible.append(seen - began)
        answered.append(done[0] - began)
        sequence += 1
    return visible, answered


def _probing(
    leader_flight: str,
    url: str,
    tag: str,
    stop: threading.Event,
    into: list[tuple[list[float], list[float]]],
) -> None:
    into.append(probe(leader_flight, url, tag, stop))


def _push_noting(pusher: Pusher, sequence: int, rows: pa.Table, done: list[float]) -> None:
    pusher.push(sequence, rows)
    done.append(time.monotonic())


def pct(values: list[float], q: float) -> str:
    if not values:
        return "   -   "
    ordered = sorted(values)
    return f"{ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000:7.1f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--writers", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=30.0)
    args = parser.parse_args()

    ctx = multiprocessing.get_context("spawn")
    ours, theirs = ctx.Pipe()
    discard = ctx.Process(target=_serve_discard, args=(theirs,), daemon=True)
    discard.start()
    raw = run_writers(args.writers, args.seconds, raw_put(ours.recv()))
    ours.send("stop")
    discard.join(10)

    with local_stack("push-bench-") as bench:
        topic = "push_bench"
        create_topic(bench.stack.kafka, topic, 1)
        cluster = LocalCluster(
            bench.root / "cluster",
            bench.stack,
            nodes={"n1": [0]},
            shard_count=1,
            pipelines=[
                PipelineSpec(
                    "events",
                    topic,
                    "events",
                    COLUMNS,
                    buffer={"min_rows": 1, "min_bytes": 1, "min_age": 0.3, "max_age": 1},
                    lanes=1,
                )
            ],
            zk_root="/push-bench",
            server={"max_request_bytes": 64 * MIB},
        )
        cluster.start()
        try:
            cluster.wait_leaders([0])
            node = cluster.nodes["n1"]
            flight_url = f"grpc://127.0.0.1:{node.flight_port}"
            # Warm: the first flushes start Spark's job machinery (seconds), which is no
            # push's cost; the runs below measure a running pipeline.
            warm = Pusher(lambda: [node.url], "events", 0, "warm-up")
            warmed = sum(warm.push(seq, batch(99, 0)).rows for seq in range(3))
            figures: dict[str, Load] = {}
            latencies: dict[str, tuple[list[float], list[float]]] = {}
            for name, url in (("flight", flight_url), ("http", node.url)):
                push = hakafka_push(url, name)
                stop = threading.Event()
                probed: list[tuple[list[float], list[float]]] = []
                prober = threading.Thread(
                    target=_probing, args=(flight_url, url, name, stop, probed)
                )
                prober.start()
                figures[name] = run_writers(args.writers, args.seconds, push)
                stop.set()
                prober.join(180)
                latencies[name] = probed[0]
            expected = (
                warmed
                + sum(f.rows for f in figures.values())
                + sum(10 * len(answered) for _visible, answered in latencies.values())
            )
            client = bench.ch.client()
            counted = client.query(
                "SELECT count(), uniqExact(_partition, _offset) FROM events"
            ).result_rows[0]
        finally:
            cluster.stop()

    print(
        f"\npush bench: {args.writers} writers, {BATCH_ROWS}-row Arrow batches, "
        f"{args.seconds:g} s each"
    )
    print(f"  raw do_put, discarded         {raw.rate()}   (the floor: no buffer, no ack)")
    for name, load in figures.items():
        share = load.rows / load.seconds / (raw.rows / raw.seconds)
        print(f"  hakafka over {name:6}          {load.rate()}   {share:.3f} of raw")
    print("\n  latency (ms)        push->queryable p50   p99   push->ack p50   p99")
    for name, (visible, answered) in latencies.items():
        print(
            f"  {name:6} ({len(answered)} probes)   {pct(visible, 0.5)} {pct(visible, 0.99)}"
            f"      {pct(answered, 0.5)} {pct(answered, 0.99)}"
        )
    for name, load in figures.items():
        p50, p99 = pct(load.answers, 0.5), pct(load.answers, 0.99)
        print(
            f"  {name} writers' answers: p50 {p50} ms, p99 {p99} ms; "
            f"{load.retried} of {len(load.answers)} pushes took more than one request"
        )
    rows, unique = int(counted[0]), int(counted[1])
    print(f"\n  ClickHouse: {rows} rows, {unique} distinct offsets; acknowledged {expected}")
    ok = rows == unique == expected
    print("  exactly once: " + ("yes" if ok else "NO"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
