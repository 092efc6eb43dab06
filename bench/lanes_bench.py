"""Catch-up ingest with one consume lane and with two, against a raw librdkafka consume.

A backlog of MESSAGES events over PARTITIONS partitions is produced once per format (JSON as
the consume bench's events are, Avro framed by confluent-kafka's serializer against the dev
stack's schema registry: the events of formats_bench.py). Then, for each format, in one run
and alternating: a raw `Consumer.consume` of the backlog (batches of 10,000, no per-message
work: the baseline), and a `PipelineLeader` with 1 lane and with 2 lanes reading it
(Kafka -> decode -> WAL appended and synced per batch -> buffer) with its flush lane running
(blocks sealed at 100,000 rows, planned and handed to a sink that takes them at once; the
checkpoint committed in memory): from start until the checkpoint reaches the backlog's end.
Times and CPU count from the moment the pipeline consumes (its lanes started; the start, a
lane process's imports, is shown apart): CPU is this process's and its lane processes'
(/proc, cpu_use.py); CPU per row compares the two lane counts, rows/s each to the raw
consume.
Then, per format, decoding alone (the backlog's values in memory, batches of 10,000, no
Kafka and no WAL): one decoder in one thread, two in threads, two in processes, each of
the two on half the messages: what CPython 3.11's GIL leaves threads, the choice behind
lanes being processes.

Run: PYTHONPATH=. .venv/bin/python bench/lanes_bench.py
"""

from __future__ import annotations

import functools
import gc
import json
import logging
import multiprocessing
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import pyarrow as pa
import structlog
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from cpu_use import CpuMeter
from formats_bench import AVRO, CONTEXT, SCHEMA, as_json, event

from buffer import Catalog, OffsetRange
from chlib.replicas import Replica
from devstack.kafka import KafkaBroker
from devstack.process import running
from devstack.records import create_topic
from devstack.schema_registry import SchemaRegistryService
from hakafka.config import Config, parse_config
from hakafka.consumer import Decoder, PartitionConsumer
from hakafka.consumer.messages import MessageColumns
from hakafka.coordination import Checkpoint, PendingIntent
from hakafka.daemon.node import GC_THRESHOLDS
from hakafka.metrics import Metrics
from hakafka.pipeline import PipelineLeader, PipelineParts
from hakafka.pipeline.blockplan import PlannedBlock
from hakafka.pipeline.parts import Flushed, LaneParts
from hakafka.settings import decoder_of, pipeline_schema, registry_of, shard_assignment
from wal import WriteAheadLog

MESSAGES = 800_000
PARTITIONS = 8
ROUNDS = 3
TIMEOUT_S = 300.0
MIB = 1 << 20
DECODE_BATCH = 10_000


class NullSink:
    """Takes every block at once: the bench measures ingest with flushes running, not
    ClickHouse."""

    def ensure_tables(self, replicas: tuple[Replica, ...]) -> None:
        pass

    def flush(self, block: PlannedBlock, replicas: tuple[Replica, ...]) -> Flushed:
        return Flushed(block.block.row_count, block.block.dead_count, None)


@dataclass
class MemoryFenced:
    """The term's checkpoint and intent in memory (no ZooKeeper in this bench)."""

    epoch: int = 1
    checkpoint: Checkpoint = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def read_checkpoint(self, pipeline: str) -> Checkpoint:
        return {}

    def checkpoint_age(self, pipeline: str) -> float | None:
        return None

    def read_other_checkpoints(self, pipeline: str) -> dict[int, Checkpoint]:
        return {}

    def read_pending(self, pipeline: str) -> PendingIntent | None:
        return None

    def write_pending(self, pipeline: str, intent: PendingIntent) -> None:
        pass

    def commit_checkpoint(self, pipeline: str, offsets: Checkpoint) -> Checkpoint:
        with self.lock:
            for topic, parts in offsets.items():
                self.checkpoint.setdefault(topic, {}).update(parts)
            return {t: dict(o) for t, o in self.checkpoint.items()}

    def writer_number(self, pipeline: str, writer: str) -> int:
        raise AssertionError("nothing pushes in this bench")

    def reached(self, topic: str, ends: dict[int, int]) -> bool:
        with self.lock:
            return self.checkpoint.get(topic) == ends


def config_for(bootstrap: str, registry: str, topic: str, fmt: str, root: Path) -> Config:
    return parse_config(
        {
            "node": "bench",
            "shards": [0],
            "data_dir": str(root),
            "zookeeper": {"hosts": "127.0.0.1:1"},
            "kafka": {"bootstrap": bootstrap},
            "clickhouse": {"replicas": {"0": {"bench": "127.0.0.1:1"}}},
            "schema_registry": {"url": registry},
            "pipelines": [
                {
                    "name": "events",
                    "topic": topic,
                    "table": "events",
                    "format": fmt,
                    "columns": {f.name: f.clickhouse_type for f in SCHEMA.columns},
                    "buffer": {
                        "max_rows": 100_000,
                        "min_rows": 100_000,
                        "min_age": 1,
                        "max_age": 1,
                    },
                    "wal": {"fsync": "batch"},
                }
            ],
        }
    )


@dataclass(frozen=True)
class Run:
    seconds: float
    cpu: float
    start: float = 0.0  # from the leader's start until it consumed


def ingest(config: Config, lanes: int, root: Path, ends: dict[int, int]) -> Run:
    """One leader reading the whole backlog with `lanes` lanes."""
    pipeline = config.pipelines[0]
    schema = pipeline_schema(pipeline)
    registry = registry_of(config)
    consumer_of = functools.partial(
        PartitionConsumer, config.kafka.bootstrap, pipeline.topic, group_id="hakafka-bench"
    )
    fenced = MemoryFenced()
    wal_dir = Path(tempfile.mkdtemp(dir=root, prefix=f"wal{lanes}_"))
    leader = PipelineLeader(
        config=pipeline,
        shard=0,
        decoder=decoder_of(pipeline, schema, registry),
        parts=PipelineParts(
            consumer=lambda: consumer_of(shard_assignment(config, pipeline, 0)),
            open_wal=functools.partial(WriteAheadLog.open, wal_dir, fsync="batch"),
            refetch=_no_refetch,
            sink=NullSink(),
            fenced=fenced,
            replicas=lambda: (),
            lanes=None
            if lanes == 1
            else LaneParts(
                consumer=consumer_of,
                decoder=functools.partial(decoder_of, pipeline, schema, registry),
                count=lanes,
            ),
        ),
        assignment=shard_assignment(config, pipeline, 0),
        rows_per_task=1_000_000,
        catalog=Catalog(),
        metrics=Metrics.create(registry=_registry()),
    )
    started = time.perf_counter()
    leader.start()
    deadline = time.monotonic() + TIMEOUT_S
    if not leader.wait_consuming(TIMEOUT_S):
        raise RuntimeError(f"{lanes} lane(s) never consumed: {leader.status}")
    # From here on: a backlog long enough makes the start (a lane process's imports) a
    # small part of it; it is reported apart.
    began = time.perf_counter()
    meter = CpuMeter(
        {"pipeline": [os.getpid(), *(p.pid for p in multiprocessing.active_children() if p.pid)]}
    )
    meter.start()
    while not fenced.reached(pipeline.topic, ends):
        if time.monotonic() > deadline or not leader.running:
            raise RuntimeError(f"{lanes} lane(s): stuck at {fenced.checkpoint} ({leader.status})")
        time.sleep(0.01)
    use = meter.stop()
    seconds = time.perf_counter() - began
    leader.stop(5.0)
    return Run(seconds, use.processes["pipeline"].cores * use.seconds, began - started)


def _no_refetch(
    ranges: Mapping[int, OffsetRange], decoder: Decoder, step: Callable[[], None]
) -> tuple[pa.Table, pa.Table | None]:
    raise AssertionError("no pending block in this bench")


def _registry() -> Any:
    from prometheus_client import CollectorRegistry

    return CollectorRegistry()


def raw_consume(bootstrap: str, topic: str, ends: dict[int, int]) -> Run:
    """librdkafka's batched consume of the backlog, no per-message work."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "raw", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in ends])
    meter = CpuMeter({"raw": os.getpid()})
    meter.start()
    left, began = sum(ends.values()), time.perf_counter()
    deadline = time.monotonic() + TIMEOUT_S
    while left > 0 and time.monotonic() < deadline:
        left -= sum(1 for m in consumer.consume(10_000, 0.5) if m.error() is None)
    seconds = time.perf_counter() - began
    use = meter.stop()
    consumer.close()
    if left:
        raise RuntimeError(f"raw consume: {left} messages never came")
    return Run(seconds, use.processes["raw"].cores * use.seconds)


def produce(bootstrap: str, topic: str, values: list[bytes]) -> dict[int, int]:
    create_topic(bootstrap, topic, PARTITIONS)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50})
    for i, value in enumerate(values):
        while True:
            try:
                producer.produce(topic, value=value, partition=i % PARTITIONS)
                break
            except BufferError:
                producer.poll(0.1)
    if producer.flush(120) != 0:
        raise RuntimeError("backlog undelivered")
    return {p: MESSAGES // PARTITIONS for p in range(PARTITIONS)}


def measure(
    label: str, runs: dict[str, Callable[[], Run]], nbytes: int
) -> dict[str, tuple[float, float, float]]:
    """Each run ROUNDS times, alternating; the median seconds and CPU seconds of each."""
    got: dict[str, list[Run]] = {name: [] for name in runs}
    for _ in range(ROUNDS):
        for name, run in runs.items():
            got[name].append(run())
    medians = {
        name: (
            statistics.median(r.seconds for r in rs),
            statistics.median(r.cpu for r in rs),
            statistics.median(r.start for r in rs),
        )
        for name, rs in got.items()
    }
    raw_s = medians["raw"][0]
    print(f"{label}: {MESSAGES} messages, {nbytes / MESSAGES:.0f} B each, {PARTITIONS} partitions")
    for name, (seconds, cpu, start) in medians.items():
        print(
            f"  {name:<8} {MESSAGES / seconds:>9,.0f} rows/s {nbytes / MIB / seconds:6.1f} MiB/s"
            f"  {raw_s / seconds:5.2f} of raw  cpu {cpu / MESSAGES * 1e6:5.1f} us/row"
            + (f"  (start {start:.1f} s)" if name != "raw" else "")
        )
    one, two = medians["1 lane"], medians["2 lanes"]
    print(f"  2 lanes / 1 lane: {one[0] / two[0]:.2f}x rows/s, {two[1] / one[1]:.2f}x CPU per row")
    return medians


def columns_of(values: list[bytes], topic: str) -> list[MessageColumns]:
    """`values` as the consume lane hands them to its decoder: batches of DECODE_BATCH."""
    chunks = []
    for at in range(0, len(values), DECODE_BATCH):
        part: list[bytes | None] = list(values[at : at + DECODE_BATCH])
        n = len(part)
        chunks.append(
            MessageColumns(
                [topic] * n, [0] * n, list(range(at, at + n)), [-1] * n, [None] * n, part
            )
        )
    return chunks


def decode_all(decoder: Decoder, chunks: list[MessageColumns]) -> int:
    return sum(decoder.decode_columns(c).rows.num_rows for c in chunks)


def _decode_process(
    make: Callable[[], Decoder],
    values: list[bytes],
    topic: str,
    gc_thresholds: tuple[int, ...],
    conn: Connection,
) -> None:
    """A process decoding its `values` each time it is told to go, sending back the rows;
    with the daemon's collector thresholds, as a lane process has."""
    gc.set_threshold(*gc_thresholds)
    decoder, chunks = make(), columns_of(values, topic)
    decode_all(decoder, chunks[:1])  # warm: imports done, a schema fetched
    conn.send("ready")
    while conn.recv() == "go":
        conn.send(decode_all(decoder, chunks))


def _in_threads(decoders: list[Decoder], parts: list[list[MessageColumns]]) -> int:
    """Each decoder on its part in a thread of its own; the rows they decoded."""
    counts = [0] * len(decoders)

    def run(i: int) -> None:
        counts[i] = decode_all(decoders[i], parts[i])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(decoders))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts)


def decode_alone(make: Callable[[], Decoder], values: list[bytes], topic: str) -> None:
    """Decoding alone (no Kafka, no WAL) of `values` with one decoder, two in threads and two
    in processes, each of the two on half of the messages, ROUNDS times alternating (the
    medians shown): what the GIL lets threads gain."""
    halves = [values[0::2], values[1::2]]
    one, chunks = make(), columns_of(values, topic)
    decoders = [make() for _ in halves]
    parts = [columns_of(h, topic) for h in halves]
    for decoder, part in [(one, chunks), *zip(decoders, parts, strict=True)]:
        decode_all(decoder, part[:1])
    spawn = multiprocessing.get_context("spawn")
    pipes = [spawn.Pipe() for _ in halves]
    processes = [
        spawn.Process(target=_decode_process, args=(make, half, topic, gc.get_threshold(), theirs))
        for half, (_, theirs) in zip(halves, pipes, strict=True)
    ]
    for process in processes:
        process.start()
    for ours, _ in pipes:
        if not ours.poll(TIMEOUT_S):
            raise RuntimeError("a decode process never got ready")
        ours.recv()

    def in_processes() -> int:
        for ours, _ in pipes:
            ours.send("go")
        return sum(ours.recv() for ours, _ in pipes)

    runs: dict[str, Callable[[], int]] = {
        "1 thread": functools.partial(decode_all, one, chunks),
        "2 threads": functools.partial(_in_threads, decoders, parts),
        "2 processes": in_processes,
    }
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(ROUNDS):
        for name, run in runs.items():
            began = time.perf_counter()
            decoded = run()
            seconds[name].append(time.perf_counter() - began)
            if decoded != len(values):
                raise RuntimeError(f"{name}: {decoded} rows of {len(values)}")
    for ours, _ in pipes:
        ours.send("stop")
    for process in processes:
        process.join(10)
    rates = {name: len(values) / statistics.median(s) for name, s in seconds.items()}
    base = rates["1 thread"]
    shown = [f"{name} {rate:,.0f} rows/s ({rate / base:.2f}x)" for name, rate in rates.items()]
    print("  decode alone: " + ", ".join(shown))


def main() -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    gc.set_threshold(*GC_THRESHOLDS)
    events = [event(i) for i in range(MESSAGES)]
    with (
        tempfile.TemporaryDirectory(prefix="lanes_bench_") as tmp,
        running(KafkaBroker(Path(tmp) / "kafka")) as broker,
        running(SchemaRegistryService(Path(tmp) / "registry")) as registry,
    ):
        root = Path(tmp)
        to_avro = AvroSerializer(SchemaRegistryClient({"url": registry.url}), json.dumps(AVRO))
        formats = {
            "json": [as_json(e) for e in events],
            "avro": [bytes(to_avro(e, CONTEXT)) for e in events],
        }
        print(f"cores: {len(os.sched_getaffinity(0))}; medians of {ROUNDS} rounds")
        for fmt, values in formats.items():
            topic = f"lanes_{fmt}"
            ends = produce(broker.bootstrap, topic, values)
            config = config_for(broker.bootstrap, registry.url, topic, fmt, root)
            measure(
                fmt,
                {
                    "raw": functools.partial(raw_consume, broker.bootstrap, topic, ends),
                    "1 lane": functools.partial(ingest, config, 1, root, ends),
                    "2 lanes": functools.partial(ingest, config, 2, root, ends),
                },
                sum(map(len, values)),
            )
            pipeline = config.pipelines[0]
            make = functools.partial(
                decoder_of, pipeline, pipeline_schema(pipeline), registry_of(config)
            )
            decode_alone(make, values, topic)


if __name__ == "__main__":
    main()
