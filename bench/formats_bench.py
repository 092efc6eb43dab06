"""Decode throughput of `format = "avro"` and `format = "protobuf"` against their raw parsers.

The same 200,000 events (9 fields: ids, strings, an enum, a timestamp, a nullable double,
an array) are serialized three ways: Confluent-framed Avro and Protobuf by confluent-kafka's
own serializers against the dev stack's schema registry, and JSON as the consume bench
produces it. Each decoder turns batches of 10,000 into Arrow batches of the same columns;
its one-core CPU time is paired (see pairing.py) with the raw parser over the same message
bodies: fastavro's `schemaless_reader` per message (records as dicts, no Arrow), and the
Protobuf class's `FromString` per message (no field read). For scale, confluent-kafka's own
deserializers (what a consumer would call per message) run once each, and the JSON decoder
gives the JSON figure on the same events. MiB/s count each format's own bytes (the Avro and
Protobuf messages are smaller than the JSON ones); rows/s compare across formats. The
garbage collector runs with the daemon's thresholds (`GC_THRESHOLDS`): a decoded batch keeps
10^4 parsed messages alive, and at CPython's default the collector would take a third of it.

Run: PYTHONPATH=. .venv/bin/python bench/formats_bench.py
"""

from __future__ import annotations

import datetime as dt
import functools
import gc
import io
import json
import logging
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fastavro
import structlog
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, timestamp_pb2
from pairing import paired

from devstack.process import running
from devstack.schema_registry import SchemaRegistryService
from hakafka.consumer import Format, MessageColumns, PipelineSchema, make_decoder
from hakafka.consumer.registry import HEADER_BYTES, RegistrySettings
from hakafka.daemon.node import GC_THRESHOLDS

MESSAGES = 200_000
BATCH = 10_000
ROUNDS = 5
MIB = 1 << 20
KINDS = ("click", "view", "buy")
CONTEXT = SerializationContext("bench", MessageField.VALUE)
SCHEMA = PipelineSchema.of(
    [
        ("id", "UInt64"),
        ("user", "String"),
        ("event", "LowCardinality(String)"),
        ("ts", "DateTime64(3)"),
        ("amount", "Float64"),
        ("country", "LowCardinality(String)"),
        ("score", "Nullable(Float64)"),
        ("tags", "Array(String)"),
        ("payload", "String"),
    ]
)
AVRO = {
    "type": "record",
    "name": "Event",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "user", "type": "string"},
        {"name": "event", "type": {"type": "enum", "name": "Kind", "symbols": list(KINDS)}},
        {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "amount", "type": "double"},
        {"name": "country", "type": "string"},
        {"name": "score", "type": ["null", "double"]},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "payload", "type": "string"},
    ],
}


def event(i: int) -> dict[str, Any]:
    return {
        "id": i,
        "user": f"user_{i % 100_000:06d}",
        "event": KINDS[i % 3],
        "ts": dt.datetime(2024, 5, 1 + i % 28, 12, i % 60, (i // 60) % 60, (i % 1000) * 1000),
        "amount": (i % 100_000) / 100,
        "country": ("DE", "US", "FR", "JP")[i % 4],
        "score": None if i % 10 == 0 else (i % 997) / 7.0,
        "tags": ["a", "b"] if i % 2 else ["c"],
        "payload": "x" * 40,
    }


def as_json(e: dict[str, Any]) -> bytes:
    body = {**e, "ts": e["ts"].isoformat(sep=" ", timespec="milliseconds")}
    return json.dumps(body, separators=(",", ":")).encode()


def proto_class() -> Any:
    """`Event` with the same fields, built from a descriptor (no protoc)."""
    f = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(name="bench.proto", package="bench", syntax="proto3")
    fdp.dependency.append("google/protobuf/timestamp.proto")
    kind = fdp.enum_type.add(name="Kind")
    for number, name in enumerate(KINDS):
        kind.value.add(name=name, number=number)
    message = fdp.message_type.add(name="Event")
    message.oneof_decl.add(name="_score")
    fields: list[tuple[str, int, str, dict[str, Any]]] = [
        ("id", f.TYPE_UINT64, "", {}),
        ("user", f.TYPE_STRING, "", {}),
        ("event", f.TYPE_ENUM, ".bench.Kind", {}),
        ("ts", f.TYPE_MESSAGE, ".google.protobuf.Timestamp", {}),
        ("amount", f.TYPE_DOUBLE, "", {}),
        ("country", f.TYPE_STRING, "", {}),
        ("score", f.TYPE_DOUBLE, "", {"proto3_optional": True, "oneof_index": 0}),
        ("tags", f.TYPE_STRING, "", {"label": f.LABEL_REPEATED}),
        ("payload", f.TYPE_STRING, "", {}),
    ]
    for number, (name, kind_, type_name, extra) in enumerate(fields, start=1):
        options = {"label": f.LABEL_OPTIONAL, **extra}
        if type_name:
            options["type_name"] = type_name
        message.field.add(name=name, number=number, type=kind_, **options)
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(timestamp_pb2.DESCRIPTOR.serialized_pb)
    pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("bench.Event"))


def proto_event(cls: Any, e: dict[str, Any]) -> Any:
    m = cls(
        id=e["id"],
        user=e["user"],
        event=KINDS.index(e["event"]),
        amount=e["amount"],
        country=e["country"],
        tags=e["tags"],
        payload=e["payload"],
    )
    m.ts.FromDatetime(e["ts"])
    if e["score"] is not None:
        m.score = e["score"]
    return m


def batches(values: list[bytes]) -> list[list[bytes]]:
    return [values[i : i + BATCH] for i in range(0, len(values), BATCH)]


def columns(batch: list[bytes]) -> MessageColumns:
    n = len(batch)
    kept: list[bytes | None] = list(batch)
    return MessageColumns(["bench"] * n, [0] * n, list(range(n)), [0] * n, [None] * n, kept)


def decode_seconds(decoder: Any, parts: list[list[bytes]]) -> float:
    """CPU seconds of `decoder` over every batch; every message must come out a row."""
    prepared = [columns(b) for b in parts]
    cpu, rows = time.process_time(), 0
    for cols in prepared:
        rows += decoder.decode_columns(cols).good
    took = time.process_time() - cpu
    expected = sum(map(len, parts))
    if rows != expected:
        raise SystemExit(f"decoded {rows} rows of {expected}")
    return took


def each_seconds(parse: Callable[[bytes], Any], values: list[bytes]) -> float:
    """CPU seconds of `parse` over every value, one call each (the raw parsers)."""
    cpu = time.process_time()
    for value in values:
        parse(value)
    return time.process_time() - cpu


def kept_seconds(parse: Callable[[bytes], Any], values: list[bytes]) -> float:
    """CPU seconds of `parse` over every value, each batch's results kept together (as any
    columnar reader must before it reads a column)."""
    cpu = time.process_time()
    for batch in batches(values):
        parsed = list(map(parse, batch))
        del parsed
    return time.process_time() - cpu


def report(label: str, nbytes: int, seconds: float, extra: str = "") -> None:
    print(
        f"{label:<44}: {nbytes / MIB / seconds:7.1f} MiB/s {MESSAGES / seconds:>10,.0f} rows/s"
        f" per CPU-second{extra}"
    )


def main() -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    gc.set_threshold(*GC_THRESHOLDS)
    events = [event(i) for i in range(MESSAGES)]
    json_values = [as_json(e) for e in events]
    cls = proto_class()
    with (
        tempfile.TemporaryDirectory(prefix="formats_bench_") as tmp,
        running(SchemaRegistryService(Path(tmp))) as registry,
    ):
        client = SchemaRegistryClient({"url": registry.url})
        to_avro = AvroSerializer(client, json.dumps(AVRO))
        to_proto = ProtobufSerializer(cls, client, {"use.deprecated.format": False})
        avro_values = [bytes(to_avro(e, CONTEXT)) for e in events]
        proto_values = [bytes(to_proto(proto_event(cls, e), CONTEXT)) for e in events]
        settings = RegistrySettings(registry.url)
        avro = make_decoder(Format.AVRO, SCHEMA, registry=settings)
        proto = make_decoder(Format.PROTOBUF, SCHEMA, registry=settings)
        decode_seconds(avro, batches(avro_values[:BATCH]))  # warm-up, writer schemas fetched
        decode_seconds(proto, batches(proto_values[:BATCH]))
        avro_deserializer = AvroDeserializer(client)
        proto_deserializer = ProtobufDeserializer(cls, {"use.deprecated.format": False})
        confluent_avro = each_seconds(lambda v: avro_deserializer(v, CONTEXT), avro_values)
        confluent_proto = each_seconds(lambda v: proto_deserializer(v, CONTEXT), proto_values)
    sizes = {n: sum(map(len, v)) for n, v in (("avro", avro_values), ("protobuf", proto_values))}
    json_bytes = sum(map(len, json_values))
    print(
        f"data: {MESSAGES} events, batches of {BATCH}; avro {sizes['avro'] / MESSAGES:.0f} B, "
        f"protobuf {sizes['protobuf'] / MESSAGES:.0f} B, json {json_bytes / MESSAGES:.0f} B "
        f"per message; medians of {ROUNDS} paired one-core runs; gc thresholds {GC_THRESHOLDS}"
    )

    writer = fastavro.parse_schema(AVRO)
    avro_bodies = [v[HEADER_BYTES:] for v in avro_values]
    avro_run = paired(
        functools.partial(
            each_seconds,
            lambda b: fastavro.schemaless_reader(io.BytesIO(b), writer, None),
            avro_bodies,
        ),
        functools.partial(decode_seconds, avro, batches(avro_values)),
        ROUNDS,
    )
    report(
        "avro: AvroDecoder to Arrow",
        sizes["avro"],
        avro_run.subject_s(),
        f" = {avro_run.ratio():.0%} of fastavro alone (range {avro_run.span()})",
    )
    report("  fastavro.schemaless_reader alone (dicts)", sizes["avro"], avro_run.base_s())
    report("  confluent AvroDeserializer (one run)", sizes["avro"], confluent_avro)

    proto_bodies = [v[HEADER_BYTES + 1 :] for v in proto_values]  # index array [0]: one byte
    proto_run = paired(
        functools.partial(each_seconds, cls.FromString, proto_bodies),
        functools.partial(decode_seconds, proto, batches(proto_values)),
        ROUNDS,
    )
    report(
        "protobuf: ProtobufDecoder to Arrow",
        sizes["protobuf"],
        proto_run.subject_s(),
        f" = {proto_run.ratio():.0%} of FromString alone (range {proto_run.span()})",
    )
    report("  Event.FromString alone (no field read)", sizes["protobuf"], proto_run.base_s())
    kept = sorted(kept_seconds(cls.FromString, proto_bodies) for _ in range(ROUNDS))
    report("  FromString, messages kept per batch", sizes["protobuf"], kept[ROUNDS // 2])
    report("  confluent ProtobufDeserializer (one run)", sizes["protobuf"], confluent_proto)

    json_decoder = make_decoder(Format.JSON, SCHEMA)
    decode_seconds(json_decoder, batches(json_values[:BATCH]))
    json_s = sorted(decode_seconds(json_decoder, batches(json_values)) for _ in range(ROUNDS))
    report("json: JsonDecoder to Arrow (same events)", json_bytes, json_s[ROUNDS // 2])


if __name__ == "__main__":
    main()
