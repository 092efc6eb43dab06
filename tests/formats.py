"""What the Avro and Protobuf tests and the formats bench share: the event schemas (a
version 2 that adds a field with a default), message classes built from descriptors (no
protoc), and producers' values serialized by confluent-kafka's own serializers against a
registry of the dev stack."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import (
    descriptor_pb2,
    descriptor_pool,
    message_factory,
    timestamp_pb2,
    wrappers_pb2,
)

from devstack.process import running
from devstack.schema_registry import SchemaRegistryService
from hakafka.consumer import DecodedBatch, MessageColumns

# The pipeline's columns for both formats; `note` came with version 2 of the schemas.
COLUMNS = {
    "id": "Int64",
    "kind": "LowCardinality(String)",
    "amount": "Nullable(Float64)",
    "note": "Nullable(String)",
}
KINDS = ("click", "view", "buy")

AVRO_V1: dict[str, Any] = {
    "type": "record",
    "name": "Event",
    "namespace": "hakafka.test",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": list(KINDS)}},
        {"name": "amount", "type": ["null", "double"], "default": None},
    ],
}
AVRO_V2: dict[str, Any] = {
    **AVRO_V1,
    "fields": [*AVRO_V1["fields"], {"name": "note", "type": "string", "default": ""}],
}

_F = descriptor_pb2.FieldDescriptorProto


def proto_event_class(package: str, *, with_note: bool) -> Any:
    """A proto3 `Event {int64 id; Kind kind; optional double amount; Timestamp at;
    [string note]}` class, built from a descriptor in a pool of its own."""
    fdp = descriptor_pb2.FileDescriptorProto(
        name=f"{package}/event.proto", package=package, syntax="proto3"
    )
    fdp.dependency.append("google/protobuf/timestamp.proto")
    kind = fdp.enum_type.add(name="Kind")
    for number, name in enumerate(KINDS):
        kind.value.add(name=name, number=number)
    event = fdp.message_type.add(name="Event")
    optional = _F.LABEL_OPTIONAL
    event.field.add(name="id", number=1, type=_F.TYPE_INT64, label=optional)
    event.field.add(
        name="kind", number=2, type=_F.TYPE_ENUM, type_name=f".{package}.Kind", label=optional
    )
    event.oneof_decl.add(name="_amount")
    event.field.add(
        name="amount",
        number=3,
        type=_F.TYPE_DOUBLE,
        label=optional,
        proto3_optional=True,
        oneof_index=0,
    )
    event.field.add(
        name="at",
        number=4,
        type=_F.TYPE_MESSAGE,
        type_name=".google.protobuf.Timestamp",
        label=optional,
    )
    if with_note:
        event.field.add(name="note", number=5, type=_F.TYPE_STRING, label=optional)
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(timestamp_pb2.DESCRIPTOR.serialized_pb)
    pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{package}.Event"))


def avro_serializer(client: SchemaRegistryClient, schema: dict[str, Any]) -> Any:
    return AvroSerializer(client, json.dumps(schema))


def proto_serializer(client: SchemaRegistryClient, message_class: Any) -> Any:
    return ProtobufSerializer(message_class, client, {"use.deprecated.format": False})


def avro_event(i: int, *, note: bool) -> dict[str, Any]:
    record: dict[str, Any] = {"id": i, "kind": KINDS[i % 3], "amount": None if i % 5 else i / 2}
    if note:
        record["note"] = f"n{i}"
    return record


def proto_event(message_class: Any, i: int, *, note: bool) -> Any:
    event = message_class(id=i, kind=i % 3)
    if i % 5 == 0:
        event.amount = i / 2
    event.at.seconds = 1_700_000_000 + i
    if note:
        event.note = f"n{i}"
    return event


def expected_row(i: int, *, note: bool) -> dict[str, Any]:
    """The columns of event `i` as ClickHouse should hold them (both formats)."""
    return {
        "id": i,
        "kind": KINDS[i % 3],
        "amount": None if i % 5 else i / 2,
        "note": f"n{i}" if note else None,
    }


def serializer_for(
    fmt: str, client: SchemaRegistryClient, *, version: int
) -> Callable[[int], bytes]:
    """`i -> value` of event `i`, serialized as `fmt` ("avro" or "protobuf") with schema
    version 1 or 2 (2 adds `note`), registering the schema under `<topic>-value`."""
    note = version == 2
    if fmt == "avro":
        serialize = avro_serializer(client, AVRO_V2 if note else AVRO_V1)
        return lambda i: bytes(serialize(avro_event(i, note=note), VALUE_CONTEXT))
    message_class = proto_event_class("hakafka.test", with_note=note)
    serialize = proto_serializer(client, message_class)
    return lambda i: bytes(serialize(proto_event(message_class, i, note=note), VALUE_CONTEXT))


def message_columns(values: Sequence[bytes | str], first: int = 0) -> MessageColumns:
    """`values` (text is UTF-8 encoded) as offsets `first`.. of partition 0 of topic `t`,
    without keys or timestamps."""
    n = len(values)
    return MessageColumns(
        topics=["t"] * n,
        partitions=[0] * n,
        offsets=list(range(first, first + n)),
        timestamps=[0] * n,
        keys=[None] * n,
        values=[v.encode() if isinstance(v, str) else v for v in values],
    )


def decode(decoder: Any, values: Sequence[bytes]) -> DecodedBatch:
    """`values` decoded as offsets 0.. of partition 0 of topic `t`."""
    return decoder.decode_columns(message_columns(values))  # type: ignore[no-any-return]


def declared(batch: DecodedBatch) -> list[dict[str, Any]]:
    """The declared columns of the good rows."""
    rows: list[dict[str, Any]] = batch.rows.select(list(COLUMNS)).to_pylist()
    return rows


def errors(batch: DecodedBatch) -> dict[int, str]:
    """Offset -> reason of every dead letter."""
    dead = batch.dead_letters
    if dead is None:
        return {}
    return dict(
        zip(dead.column("_offset").to_pylist(), dead.column("_error").to_pylist(), strict=True)
    )


AVRO_TYPED = {
    "u": "UUID",
    "ip4": "IPv4",
    "ip6": "IPv6",
    "kind": "Enum8('click' = 1, 'view' = 2)",
    "fx": "FixedString(4)",
    "m": "Map(String, Int64)",
    "t": "Tuple(a Int64, b String)",
    "n": "Nested(x Int64, y String)",
    "j": "JSON",
    "d": "Date",
    "us": "Array(UUID)",
}
AVRO_TYPED_WRITER = {
    "type": "record",
    "name": "Typed",
    "fields": [
        {"name": "u", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "ip4", "type": "string"},
        {"name": "ip6", "type": "string"},
        {"name": "kind", "type": {"type": "enum", "name": "K", "symbols": ["click", "view"]}},
        {"name": "fx", "type": {"type": "fixed", "name": "F", "size": 4}},
        {"name": "m", "type": {"type": "map", "values": "long"}},
        {
            "name": "t",
            "type": {
                "type": "record",
                "name": "T",
                "fields": [{"name": "a", "type": "long"}, {"name": "b", "type": "string"}],
            },
        },
        {
            "name": "n",
            "type": {
                "type": "array",
                "items": {
                    "type": "record",
                    "name": "N",
                    "fields": [{"name": "x", "type": "long"}, {"name": "y", "type": "string"}],
                },
            },
        },
        {"name": "j", "type": "string"},
        {"name": "d", "type": {"type": "int", "logicalType": "date"}},
        {"name": "us", "type": {"type": "array", "items": "string"}},
    ],
}
UUID_TEXT = "0f8FAD5B-D9CB-469F-A165-70867728950E"


def avro_typed_record(**changes: Any) -> dict[str, Any]:
    record = {
        "u": UUID_TEXT,
        "ip4": "10.0.0.1",
        "ip6": "2001:DB8::1",
        "kind": "view",
        "fx": b"ab\x00\x00",
        "m": {"a": 1, "b": 2},
        "t": {"a": 7, "b": "seven"},
        "n": [{"x": 1, "y": "one"}, {"x": 2, "y": "two"}],
        "j": '{"k": [1, 2]}',
        "d": dt.date(2024, 2, 29),
        "us": [UUID_TEXT.lower()],
    }
    return {**record, **changes}


# The columns of a `proto_typed_class` message, each of its own field.
PROTO_TYPED = {
    "u": "UUID",
    "kind": "Enum8('click' = 1, 'view' = 2)",
    "fx": "FixedString(4)",
    "m": "Map(String, Int64)",
    "us": "Array(UUID)",
    "w": "Nullable(Int32)",
}


def proto_typed_class() -> Any:
    """`Typed {string u; Kind kind; bytes fx; map<string, int64> m; repeated string us;
    google.protobuf.Int32Value w}`, built from a descriptor."""
    f = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(name="typed.proto", package="typed", syntax="proto3")
    fdp.dependency.append("google/protobuf/wrappers.proto")
    kind = fdp.enum_type.add(name="Kind")
    for number, name in enumerate(("unknown", "click", "view")):
        kind.value.add(name=name, number=number)
    message = fdp.message_type.add(name="Typed")
    entry = message.nested_type.add(name="MEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=f.TYPE_STRING, label=f.LABEL_OPTIONAL)
    entry.field.add(name="value", number=2, type=f.TYPE_INT64, label=f.LABEL_OPTIONAL)
    optional, repeated = f.LABEL_OPTIONAL, f.LABEL_REPEATED
    message.field.add(name="u", number=1, type=f.TYPE_STRING, label=optional)
    message.field.add(
        name="kind", number=2, type=f.TYPE_ENUM, type_name=".typed.Kind", label=optional
    )
    message.field.add(name="fx", number=3, type=f.TYPE_BYTES, label=optional)
    message.field.add(
        name="m", number=4, type=f.TYPE_MESSAGE, type_name=".typed.Typed.MEntry", label=repeated
    )
    message.field.add(name="us", number=5, type=f.TYPE_STRING, label=repeated)
    message.field.add(
        name="w",
        number=6,
        type=f.TYPE_MESSAGE,
        type_name=".google.protobuf.Int32Value",
        label=optional,
    )
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(wrappers_pb2.DESCRIPTOR.serialized_pb)
    pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("typed.Typed"))


# Subject `events-value` under the default TopicNameStrategy.
VALUE_CONTEXT = SerializationContext("events", MessageField.VALUE)


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[SchemaRegistryService]:
    """A schema registry process of the dev stack for one test (state under tmp_path)."""
    with running(SchemaRegistryService(tmp_path / "schema_registry")) as service:
        yield service


def produce_values(
    bootstrap: str, topic: str, values: Sequence[bytes], partitions: int
) -> list[tuple[int, int]]:
    """Produce `values` round-robin over `partitions`; the (partition, offset) of each, in
    the order of `values` (from the broker's delivery reports)."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "acks": "all"})
    where: list[tuple[int, int] | None] = [None] * len(values)

    def delivered(i: int) -> Callable[[Any, Any], None]:
        def report(err: Any, msg: Any) -> None:
            if err is not None:
                raise RuntimeError(f"delivery failed: {err}")
            where[i] = (msg.partition(), msg.offset())

        return report

    for i, value in enumerate(values):
        producer.produce(topic, value=value, partition=i % partitions, on_delivery=delivered(i))
        if i % 1000 == 0:
            producer.poll(0)
    if producer.flush(60) != 0:
        raise RuntimeError("records still undelivered after 60 s")
    assert all(w is not None for w in where)
    return [w for w in where if w is not None]
