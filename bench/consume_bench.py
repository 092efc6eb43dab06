"""Consume + decode throughput of hakafka.consumer against the local tansu broker.

Produces its own data (500k JSON messages of ~200 bytes over 8 partitions), then measures in
one run: raw batched `Consumer.consume` (no per-message work; librdkafka defaults, then the
hakafka tuning) as the baseline, `PartitionConsumer` + `JsonDecoder` to Arrow, and decode
alone (wall and one-core CPU time), plus the cost of isolating one bad message per batch.
Published anchor: ByteHouse HaKafka, 10-20 MiB/s per consumer.

Run: .venv/bin/python bench/consume_bench.py
"""

from __future__ import annotations

import json
import logging
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.json as pjson
import structlog
from confluent_kafka import Consumer, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from hakafka.consumer import (
    JsonDecoder,
    MessageColumns,
    PartitionConsumer,
    PipelineSchema,
    make_decoder,
)
from hakafka.consumer.partition_consumer import DEFAULT_TUNING
from hakafka.devstack.kafka import KafkaBroker

MESSAGES = 500_000
PARTITIONS = 8
BATCH = 10_000
TOPIC = "bench_events"
MIB = 1 << 20
SCHEMA = PipelineSchema.of(
    [
        ("id", "UInt64"),
        ("user", "String"),
        ("event", "LowCardinality(String)"),
        ("ts", "DateTime64(3)"),
        ("amount", "Decimal(12, 2)"),
        ("country", "LowCardinality(String)"),
        ("score", "Nullable(Float64)"),
        ("tags", "Array(String)"),
        ("payload", "String"),
    ],
    ["_topic", "_timestamp", "_key"],
)


def message(i: int) -> bytes:
    body = {
        "id": i,
        "user": f"user_{i % 100_000:06d}",
        "event": ("click", "view", "buy")[i % 3],
        "ts": f"2024-05-{1 + i % 28:02d} 12:{i % 60:02d}:{(i // 60) % 60:02d}.{i % 1000:03d}",
        "amount": f"{(i % 100_000) / 100:.2f}",
        "country": ("DE", "US", "FR", "JP")[i % 4],
        "score": (i % 997) / 7.0,
        "tags": ["a", "b"] if i % 2 else ["c"],
        "payload": "",
    }
    raw = json.dumps(body, separators=(",", ":"))
    body["payload"] = "x" * max(0, 200 - len(raw))
    return json.dumps(body, separators=(",", ":")).encode()


def produce(bootstrap: str) -> int:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)]).values():
        future.result(timeout=30)
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 20,
            "batch.size": 1 << 20,
            "queue.buffering.max.messages": 1_000_000,
        }
    )
    total = 0
    for i in range(MESSAGES):
        value = message(i)
        total += len(value)
        producer.produce(TOPIC, value=value, key=b"%d" % i, partition=i % PARTITIONS)
        if i % 20_000 == 0:
            producer.poll(0)
    if producer.flush(120) != 0:
        raise SystemExit("producer could not deliver every message")
    return total


def raw_consume(bootstrap: str, tuning: dict[str, Any]) -> tuple[float, list[list[Message]]]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "bench",
            "enable.auto.commit": False,
            "auto.offset.reset": "error",
            **tuning,
        }
    )
    consumer.assign([TopicPartition(TOPIC, p, 0) for p in range(PARTITIONS)])
    batches: list[list[Message]] = []
    count = 0
    deadline = time.monotonic() + 60
    start = time.perf_counter()
    while count < MESSAGES and time.monotonic() < deadline:
        batch = consumer.consume(BATCH, 1.0)
        count += len(batch)
        batches.append(batch)
    elapsed = time.perf_counter() - start
    consumer.close()
    if count != MESSAGES:
        raise SystemExit(f"raw consume got {count} of {MESSAGES} messages")
    return elapsed, batches


def consume_and_decode(bootstrap: str) -> tuple[float, int]:
    consumer = PartitionConsumer(bootstrap, TOPIC, range(PARTITIONS), group_id="bench")
    decoder = make_decoder("json", SCHEMA)
    consumer.assign({p: 0 for p in range(PARTITIONS)})
    rows = 0
    seen = 0
    deadline = time.monotonic() + 60
    start = time.perf_counter()
    while seen < MESSAGES and time.monotonic() < deadline:
        messages = consumer.consume(BATCH, 1.0)
        if messages:
            decoded = decoder.decode(messages)
            seen += len(messages)
            rows += decoded.good
    elapsed = time.perf_counter() - start
    consumer.close()
    if rows != MESSAGES:
        raise SystemExit(f"consume+decode produced {rows} rows of {MESSAGES}")
    return elapsed, rows


def parse_alone(batches: list[list[Message]]) -> float:
    """CPU seconds of `pyarrow.json.read_json` alone over the joined batches (the ceiling)."""
    decoder = make_decoder("json", SCHEMA)
    assert isinstance(decoder, JsonDecoder)
    joined = [b"\n".join(m.value() or b"" for m in batch) for batch in batches if batch]
    cpu = time.process_time()
    for data in joined:
        pjson.read_json(
            pa.BufferReader(data),
            read_options=decoder.read_options,
            parse_options=decoder.parse_options,
        )
    return time.process_time() - cpu


def decode_alone(batches: list[list[Message]], *, one_bad: bool) -> tuple[float, float, int]:
    decoder = make_decoder("json", SCHEMA)
    columns = [MessageColumns.from_messages(b) for b in batches if b]
    if one_bad:
        for cols in columns:
            cols.values[len(cols) // 3] = b'{"id":"not a number"}'
    decoder.decode_columns(columns[0])  # warm-up: Arrow kernels, numpy
    rows = 0
    cpu = time.process_time()
    wall = time.perf_counter()
    for cols in columns:
        rows += decoder.decode_columns(cols).good
    return time.perf_counter() - wall, time.process_time() - cpu, rows


def main() -> None:
    # The one-bad-message run dead-letters one message per batch: keep its warnings quiet.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    with tempfile.TemporaryDirectory(prefix="consume_bench_") as tmp:
        broker = KafkaBroker(Path(tmp))
        broker.start()
        try:
            t0 = time.perf_counter()
            total = produce(broker.bootstrap)
            produce_s = time.perf_counter() - t0
            mib = total / MIB
            print(
                f"data: {MESSAGES} JSON messages, {total / MESSAGES:.0f} B avg, "
                f"{mib:.1f} MiB, {PARTITIONS} partitions (produced in {produce_s:.1f} s)"
            )
            default_s, _ = raw_consume(broker.bootstrap, {})
            raw_s, batches = raw_consume(broker.bootstrap, DEFAULT_TUNING)
            print(
                f"raw consume, librdkafka defaults : {MESSAGES / default_s:>10,.0f} msg/s "
                f"{mib / default_s:7.1f} MiB/s"
            )
            print(
                f"raw consume, hakafka tuning (base): {MESSAGES / raw_s:>10,.0f} msg/s "
                f"{mib / raw_s:7.1f} MiB/s"
            )
            both_s, rows = consume_and_decode(broker.bootstrap)
            print(
                f"consume + JSON decode to Arrow    : {rows / both_s:>10,.0f} rows/s "
                f"{mib / both_s:7.1f} MiB/s  = {raw_s / both_s:.0%} of raw consume "
                "(target >= 50%)"
            )
        finally:
            broker.stop()
    wall, cpu, rows = decode_alone(batches, one_bad=False)
    print(
        f"decode alone (batches of {BATCH})   : {rows / wall:>10,.0f} rows/s "
        f"{mib / wall:7.1f} MiB/s wall, {mib / cpu:7.1f} MiB/s per CPU-second "
        "(target >= 100 MiB/s on one core)"
    )
    parse_cpu = parse_alone(batches)
    print(
        f"  pyarrow.json.read_json alone      : {mib / parse_cpu:7.1f} MiB/s per CPU-second "
        f"(decoder = {parse_cpu / cpu:.0%} of the bare parser)"
    )
    wall_bad, _, rows_bad = decode_alone(batches, one_bad=True)
    print(
        f"decode, one bad message per batch : {rows_bad / wall_bad:>10,.0f} rows/s "
        f"{mib / wall_bad:7.1f} MiB/s wall = {wall / wall_bad:.0%} of the all-good speed"
    )
    print("anchor: ByteHouse HaKafka 10-20 MiB/s per consumer")


if __name__ == "__main__":
    main()
