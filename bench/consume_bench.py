"""Consume + decode throughput of hakafka.consumer against the local tansu broker.

Produces its own data (500k JSON messages of ~200 bytes over 8 partitions), then measures in
one run: raw batched `Consumer.consume` (no per-message work; librdkafka defaults, then the
hakafka tuning) as the baseline against `PartitionConsumer` + `JsonDecoder` to Arrow; decode
alone in one-core CPU time against the bare `pyarrow.json` parser; and the cost of isolating
one bad message per batch. Each pair runs alternately several times (see pairing.py); the
ratios are the medians of the pairs'.
Published anchor: ByteHouse HaKafka, 10-20 MiB/s per consumer.

Run: .venv/bin/python bench/consume_bench.py
"""

from __future__ import annotations

import functools
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
from pairing import paired

from devstack.kafka import KafkaBroker
from hakafka.consumer import (
    Format,
    MessageColumns,
    PartitionConsumer,
    PipelineSchema,
    make_decoder,
)
from hakafka.consumer.json_decoder import JsonDecoder
from hakafka.consumer.partition_consumer import DEFAULT_TUNING

MESSAGES = 500_000
PARTITIONS = 8
BATCH = 10_000
# Paired, alternating rounds (see pairing.py): consume runs take ~2 s, decode runs ~1 s.
CONSUME_ROUNDS = 5
DECODE_ROUNDS = 7
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


def raw_seconds(bootstrap: str, keep: list[list[Message]]) -> float:
    """Seconds of one tuned raw consume; the first run's batches are kept in `keep`."""
    seconds, batches = raw_consume(bootstrap, DEFAULT_TUNING)
    if not keep:
        keep.extend(batches)
    return seconds


def consume_and_decode(bootstrap: str) -> float:
    """Seconds of `PartitionConsumer` + `JsonDecoder` over every message."""
    consumer = PartitionConsumer(bootstrap, TOPIC, range(PARTITIONS), group_id="bench")
    decoder = make_decoder(Format.JSON, SCHEMA)
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
    return elapsed


def parse_alone(joined: list[bytes], decoder: JsonDecoder) -> float:
    """CPU seconds of `pyarrow.json.read_json` alone over the joined batches (the ceiling)."""
    cpu = time.process_time()
    for data in joined:
        pjson.read_json(
            pa.BufferReader(data),
            read_options=decoder.read_options,
            parse_options=decoder.parse_options,
        )
    return time.process_time() - cpu


def decode_alone(batches: list[list[Message]], decoder: JsonDecoder, *, spoil: bool) -> float:
    """CPU seconds of `decoder` over fresh columns of every batch (with `spoil`, one message
    in each is bad); every other message must come out a row."""
    columns = [MessageColumns.from_messages(b) for b in batches if b]
    if spoil:
        for cols in columns:
            cols.values[len(cols) // 3] = b'{"id":"not a number"}'
    rows = 0
    cpu = time.process_time()
    for cols in columns:
        rows += decoder.decode_columns(cols).good
    took = time.process_time() - cpu
    expected = MESSAGES - (len(columns) if spoil else 0)
    if rows != expected:
        raise SystemExit(f"decode alone produced {rows} rows of {expected}")
    return took


def main() -> None:
    # The one-bad-message runs dead-letter one message per batch: keep their warnings quiet.
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
                f"{mib:.1f} MiB, {PARTITIONS} partitions (produced in {produce_s:.1f} s); "
                f"medians of {CONSUME_ROUNDS} paired consume runs, {DECODE_ROUNDS} decode runs"
            )
            default_s, _ = raw_consume(broker.bootstrap, {})
            print(
                f"raw consume, librdkafka defaults  : {MESSAGES / default_s:>10,.0f} msg/s "
                f"{mib / default_s:7.1f} MiB/s (one run)"
            )
            kept: list[list[Message]] = []
            consumed = paired(
                functools.partial(raw_seconds, broker.bootstrap, kept),
                functools.partial(consume_and_decode, broker.bootstrap),
                CONSUME_ROUNDS,
            )
        finally:
            broker.stop()
    print(
        f"raw consume, hakafka tuning (base): {MESSAGES / consumed.base_s():>10,.0f} msg/s "
        f"{mib / consumed.base_s():7.1f} MiB/s"
    )
    print(
        f"consume + JSON decode to Arrow    : {MESSAGES / consumed.subject_s():>10,.0f} rows/s "
        f"{mib / consumed.subject_s():7.1f} MiB/s = {consumed.ratio():.0%} of raw consume "
        f"(range {consumed.span()}; target >= 50%)"
    )
    decoder = make_decoder(Format.JSON, SCHEMA)
    assert isinstance(decoder, JsonDecoder)
    joined = [b"\n".join(m.value() or b"" for m in batch) for batch in kept if batch]
    decode_alone(kept, decoder, spoil=False)  # warm-up: Arrow kernels, numpy
    parsed = paired(
        functools.partial(parse_alone, joined, decoder),
        functools.partial(decode_alone, kept, decoder, spoil=False),
        DECODE_ROUNDS,
    )
    print(
        f"decode alone (batches of {BATCH})   : {mib / parsed.subject_s():7.1f} MiB/s "
        "per CPU-second (target >= 100 MiB/s on one core)"
    )
    print(
        f"  pyarrow.json.read_json alone      : {mib / parsed.base_s():7.1f} MiB/s per CPU-second "
        f"(decoder = {parsed.ratio():.0%} of the bare parser, range {parsed.span()})"
    )
    spoiled = paired(
        functools.partial(decode_alone, kept, decoder, spoil=False),
        functools.partial(decode_alone, kept, decoder, spoil=True),
        DECODE_ROUNDS,
    )
    print(
        f"decode, one bad message per batch : {mib / spoiled.subject_s():7.1f} MiB/s "
        f"per CPU-second = {spoiled.ratio():.0%} of the all-good speed (range {spoiled.span()})"
    )
    print("anchor: ByteHouse HaKafka 10-20 MiB/s per consumer")


if __name__ == "__main__":
    main()
