"""Pushes into the buffer (#33), with real daemons: how many rows a second writers push into a
pipeline's buffer over Flight `do_put` and HTTP `POST /insert` in 10,000-row Arrow batches,
how long a batch takes to be queryable and to be answered, and what the answer's copy to
another node costs.

WRITERS writer threads in this process each push 10,000-row batches one after the other
(one batch in flight per writer, as the README asks) for SECONDS seconds through
`buffer.push_client.Pusher`, into pipelines whose topics are empty. Two clusters on the
local stack, one after the other:
- one node (flushes every 0.3 s): no other node holds a copy, so a push is answered once
  flushed; over Flight, then over HTTP;
- two nodes (flushes every 2 s or so): answered once copied to the other node
  (`push_acks = 1`), then on a second pipeline once in the leader's WAL (`push_acks = 0`);
  the difference is the copy's cost.

Baseline, in the same run: the same writers `do_put` the same batches into a Flight server in
its own process that reads and discards them (the floor of any Flight push on this machine).

Every pipeline is warmed first (three batches pushed and flushed: the first flushes start
Spark's job machinery). Latency: while the load runs, a probe writer pushes a 10-row batch
every PROBE_S s; from the push's start to (a) its rows counted by a query on the leader's
buffer (polled over Flight) and (b) its answer. p50/p99 over the probes.

At the end ClickHouse holds every answered row once (counted by `_partition`, `_offset`),
else the exit code is 1.

Run: PYTHONPATH=. .venv/bin/python bench/push_bench.py [--writers N] [--seconds S]  (~6 min)
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
from benchstack import Bench, local_stack

from buffer.client import query as buffer_query
from buffer.push_client import Pusher
from devstack.cluster import DaemonNode, LocalCluster, PipelineSpec
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


def hakafka_push(
    url: str, pipeline: str, tag: str
) -> Callable[[int, int, pa.Table], tuple[int, int]]:
    """Each writer's pushes into `pipeline` through a `Pusher` of its own, writer id
    `<tag>-<n>`."""
    pushers: dict[int, Pusher] = {}

    def push(writer: int, sequence: int, table: pa.Table) -> tuple[int, int]:
        writer_id = f"{tag.replace(' ', '').replace(',', '-')}-{writer}"
        pusher = pushers.setdefault(writer, Pusher(lambda: [url], pipeline, 0, writer_id))
        answer = pusher.push(sequence, table)
        return answer.rows, answer.attempts

    return push


def probe(
    leader_flight: str, url: str, pipeline: str, tag: str, stop: threading.Event
) -> tuple[list[float], list[float]]:
    """(push -> queryable, push -> answered) seconds of a 10-row batch into `pipeline` every
    PROBE_S s, by writer `probe-<tag>`."""
    writer = "probe-" + tag.replace(" ", "").replace(",", "-")
    pusher = Pusher(lambda: [url], pipeline, 0, writer)
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
        sql = f"SELECT count(*) AS n FROM {pipeline} WHERE id = {marker}"
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
    where: tuple[str, str, str, str],
    stop: threading.Event,
    into: list[tuple[list[float], list[float]]],
) -> None:
    """`probe` at `where` (leader's Flight URL, push URL, pipeline, tag), result `into`."""
    into.append(probe(*where, stop))


def _push_noting(pusher: Pusher, sequence: int, rows: pa.Table, done: list[float]) -> None:
    pusher.push(sequence, rows)
    done.append(time.monotonic())


def pct(values: list[float], q: float) -> str:
    if not values:
        return "   -   "
    ordered = sorted(values)
    return f"{ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000:7.1f}"


@dataclass
class Run:
    """One measured run: its label, what it pushed and its probes' latencies."""

    label: str
    table: str
    load: Load
    visible: list[float]
    answered: list[float]


def measure(
    node: DaemonNode, pipeline: str, transport: str, label: str, *, writers: int, seconds: float
) -> Run:
    """`writers` pushing into `pipeline` on `node` over `transport` for `seconds`, a probe
    beside them."""
    flight_url = f"grpc://127.0.0.1:{node.flight_port}"
    url = flight_url if transport == "flight" else node.url
    push = hakafka_push(url, pipeline, label)
    stop = threading.Event()
    probed: list[tuple[list[float], list[float]]] = []
    prober = threading.Thread(
        target=_probing, args=((flight_url, url, pipeline, label), stop, probed)
    )
    prober.start()
    load = run_writers(writers, seconds, push)
    stop.set()
    prober.join(180)
    visible, answered = probed[0]
    return Run(label, pipeline, load, visible, answered)


def spec(name: str, topic: str, acks: int, min_age: float) -> PipelineSpec:
    return PipelineSpec(
        name,
        topic,
        name,
        COLUMNS,
        buffer={"min_rows": 1, "min_bytes": 1, "min_age": min_age, "max_age": 2 * min_age + 1},
        lanes=1,
        push_acks=acks,
    )


def run_cluster(
    bench: Bench,
    nodes: dict[str, list[int]],
    pipelines: list[PipelineSpec],
    runs: list[tuple[str, str, str]],
    args: argparse.Namespace,
) -> tuple[list[Run], list[str]]:
    """Start `nodes`, warm each pipeline, measure `runs` (pipeline, transport, label) on the
    leader, then check every answered row in ClickHouse once; (runs, problems)."""
    for p in pipelines:
        create_topic(bench.stack.kafka, p.topic, 1)
    cluster = LocalCluster(
        bench.root / f"cluster-{len(nodes)}",
        bench.stack,
        nodes=nodes,
        shard_count=1,
        pipelines=pipelines,
        zk_root=f"/push-bench-{len(nodes)}",
        server={"max_request_bytes": 64 * MIB},
        spark_on_followers=len(nodes) > 1,
    )
    cluster.start()
    problems: list[str] = []
    try:
        node = cluster.nodes[cluster.wait_leaders([0])[0]]
        if len(nodes) > 1:
            others = [n for name, n in cluster.nodes.items() if n is not node]
            deadline = time.monotonic() + 120
            while not all(o.flush_path_warm() for o in others) and time.monotonic() < deadline:
                time.sleep(0.5)
        # Warm: the first flushes start Spark's job machinery (seconds), which is no push's
        # cost; the runs below measure a running pipeline.
        warmed = {}
        for p in pipelines:
            warm = Pusher(lambda: [node.url], p.name, 0, "warm-up")
            warmed[p.name] = sum(warm.push(seq, batch(99, 0)).rows for seq in range(3))
        done = [
            measure(node, p, t, label, writers=args.writers, seconds=args.seconds)
            for p, t, label in runs
        ]
        client = bench.ch.client()
        for p in pipelines:
            expected = warmed[p.name] + sum(
                r.load.rows + 10 * len(r.answered) for r in done if r.table == p.name
            )
            counted = (0, 0)
            deadline = time.monotonic() + 120  # answered before their flush: wait for it
            while time.monotonic() < deadline:
                row = client.query(
                    f"SELECT count(), uniqExact(_partition, _offset) FROM {p.name}"
                ).result_rows[0]
                counted = (int(row[0]), int(row[1]))
                if counted[0] >= expected:
                    break
                time.sleep(1)
            rows, distinct = counted
            print(f"  {p.name}: ClickHouse {rows} rows, {distinct} distinct; answered {expected}")
            if not counted[0] == counted[1] == expected:
                problems.append(f"{p.name}: {counted} in ClickHouse, {expected} answered")
    finally:
        cluster.stop()
    return done, problems


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
        # One node: no other node to copy to, so the flush answers.
        flushed, problems = run_cluster(
            bench,
            {"n1": [0]},
            [spec("events", "push_events", 1, 0.3)],
            [("events", "flight", "flight"), ("events", "http", "http")],
            args,
        )
        # Two nodes: answered once copied to the other (push_acks = 1), or once in the
        # leader's WAL (0); flushes every 2 s or so.
        copied, more = run_cluster(
            bench,
            {"n1": [0], "n2": [0]},
            [spec("copied", "push_copied", 1, 2.0), spec("walonly", "push_walonly", 0, 2.0)],
            [("copied", "flight", "flight, 1 copy"), ("walonly", "flight", "flight, WAL only")],
            args,
        )
        problems += more

    print(
        f"\npush bench: {args.writers} writers, {BATCH_ROWS}-row Arrow batches, "
        f"{args.seconds:g} s each"
    )
    print(f"  raw do_put, discarded            {raw.rate()}   (the floor: no buffer, no ack)")
    for run in flushed + copied:
        share = run.load.rows / run.load.seconds / (raw.rows / raw.seconds)
        print(f"  {run.label:28} {run.load.rate()}   {share:.3f} of raw")
    print("\n  latency (ms)                    push->queryable p50   p99   push->answer p50   p99")
    for run in flushed + copied:
        print(
            f"  {run.label:20} ({len(run.answered):2} probes)   {pct(run.visible, 0.5)} "
            f"{pct(run.visible, 0.99)}      {pct(run.answered, 0.5)} {pct(run.answered, 0.99)}"
        )
    for run in flushed + copied:
        p50, p99 = pct(run.load.answers, 0.5), pct(run.load.answers, 0.99)
        print(
            f"  {run.label} writers' answers: p50 {p50} ms, p99 {p99} ms; "
            f"{run.load.retried} of {len(run.load.answers)} pushes took more than one request"
        )
    print("  exactly once: " + ("yes" if not problems else "NO: " + "; ".join(problems)))
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
