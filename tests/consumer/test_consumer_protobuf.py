"""`format = "protobuf"`: Confluent-framed messages (schema id + message-index array), their
classes built from the registry's descriptors; confluent-kafka's serializer produces them."""

from __future__ import annotations

import base64
import datetime as dt
from typing import Any

import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from devstack.schema_registry import SchemaRegistryService
from hakafka.consumer import Format, PipelineSchema, make_decoder
from hakafka.consumer.protobuf import message_indexes
from hakafka.consumer.registry import RegistrySettings, RegistryUnavailableError
from tests.formats import (
    COLUMNS,
    PROTO_TYPED,
    VALUE_CONTEXT,
    declared,
    decode,
    errors,
    expected_row,
    proto_event,
    proto_event_class,
    proto_serializer,
    proto_typed_class,
    registry,
    serializer_for,
)

__all__ = ["registry"]  # the fixture


def decoder(registry: SchemaRegistryService, columns: dict[str, str] = COLUMNS) -> Any:
    return make_decoder(
        Format.PROTOBUF,
        PipelineSchema.of(columns.items()),
        registry=RegistrySettings(registry.url),
    )


def test_two_writer_versions_interleaved_keep_kafka_order_and_evolve(
    registry: SchemaRegistryService,
) -> None:
    client = SchemaRegistryClient({"url": registry.url})
    v1 = serializer_for("protobuf", client, version=1)
    v2 = serializer_for("protobuf", client, version=2)
    values = [(v2 if i % 4 == 0 else v1)(i) for i in range(200)]
    batch = decode(decoder(registry), values)
    assert batch.bad == 0
    assert declared(batch) == [expected_row(i, note=i % 4 == 0) for i in range(200)]
    assert client.get_versions("events-value") == [1, 2]


def test_timestamps_enums_by_number_and_the_message_index_path(
    registry: SchemaRegistryService,
) -> None:
    client = SchemaRegistryClient({"url": registry.url})
    value = serializer_for("protobuf", client, version=1)(5)
    assert value[5] == 0  # the first message type: a single 0 byte
    assert message_indexes(b"\x00\x00\x00\x00\x01\x04\x02\x06") == ((1, 3), 8)
    columns = {"id": "UInt32", "kind": "Int8", "at": "DateTime64(3, 'UTC')"}
    batch = decode(decoder(registry, columns), [value])
    assert batch.rows.select(list(columns)).to_pylist() == [
        {"id": 5, "kind": 2, "at": dt.datetime(2023, 11, 14, 22, 13, 25, tzinfo=dt.UTC)}
    ]


def test_bad_inputs_are_dead_letters_with_their_reason(registry: SchemaRegistryService) -> None:
    client = SchemaRegistryClient({"url": registry.url})
    good = serializer_for("protobuf", client, version=1)
    ok = good(10)
    values = [
        good(0),
        b"\x07" + ok[1:],  # wrong magic byte
        b"\x00\x00\x00\x00\x2a" + ok[5:],  # schema id 42: unknown
        ok[:6] + b"\xff\xff\xff",  # not a protobuf message
        b"\x00\x00\x00\x00\x01\x02\x0a",  # index path [5]: no such message type
        b"\x00\x00\x00\x00\x01",  # the header and nothing else
        good(5),
    ]
    batch = decode(decoder(registry), values)
    assert declared(batch) == [expected_row(0, note=False), expected_row(5, note=False)]
    found = errors(batch)
    assert found[1] == "wrong magic byte 7 (expected 0): not in the Confluent wire format"
    assert found[2] == "unknown schema id 42: the schema registry has no such schema"
    assert "Error parsing message with type 'hakafka.test.Event'" in found[3]
    assert found[4] == "writer schema 1 message [5] does not exist"
    assert found[5] == "schema id 1: message-index array cut short"
    assert len(found) == 5


def test_a_writer_that_does_not_fit_and_an_avro_id_are_dead_letters(
    registry: SchemaRegistryService,
) -> None:
    client = SchemaRegistryClient({"url": registry.url})
    values = [serializer_for("protobuf", client, version=1)(1)]
    batch = decode(decoder(registry, {**COLUMNS, "kind": "Float64"}), values)
    assert errors(batch) == {
        0: "writer schema 1 message [0] (hakafka.test.Event): field 'kind' (enum) does not "
        "fit column 'kind' Float64"
    }
    avro = serializer_for("avro", client, version=1)(1)
    batch = decode(decoder(registry), [avro])
    assert errors(batch) == {0: "writer schema 2 is AVRO, not Protobuf"}


def test_a_registry_that_cannot_answer_raises_and_decides_nothing(
    registry: SchemaRegistryService,
) -> None:
    client = SchemaRegistryClient({"url": registry.url})
    message_class = proto_event_class("hakafka.test", with_note=False)
    serialize = proto_serializer(client, message_class)
    values = [serialize(proto_event(message_class, i, note=False), VALUE_CONTEXT) for i in range(3)]
    fresh = decoder(registry)
    registry.stop()
    with pytest.raises(RegistryUnavailableError, match="unreachable for schema id 1"):
        decode(fresh, values)
    registry.start()
    assert decode(fresh, values).good == 3


def test_a_schema_whose_imports_cannot_be_resolved_dead_letters_its_messages(
    registry: SchemaRegistryService,
) -> None:
    client = SchemaRegistryClient({"url": registry.url})
    proto = descriptor_pb2.FileDescriptorProto(name="x.proto", package="x", syntax="proto3")
    proto.dependency.append("other/lib.proto")  # neither a reference nor a well-known type
    proto.message_type.add(name="M")
    text = base64.b64encode(proto.SerializeToString()).decode()
    schema_id = client.register_schema("x-value", Schema(text, "PROTOBUF"))
    value = b"\x00" + schema_id.to_bytes(4, "big") + b"\x00"
    batch = decode(decoder(registry), [value])
    assert errors(batch) == {
        0: f"writer schema {schema_id} is not a usable Protobuf schema: imports "
        "other/lib.proto, which is neither a reference nor a well-known type"
    }


def test_the_clickhouse_types_from_protobuf_are_converted_and_checked_like_json(
    registry: SchemaRegistryService,
) -> None:
    client = SchemaRegistryClient({"url": registry.url})
    typed = proto_typed_class()
    serialize = proto_serializer(client, typed)
    uuid = "0F8FAD5B-D9CB-469F-A165-70867728950E"

    def value(**changes: Any) -> bytes:
        fields: dict[str, Any] = {"u": uuid, "kind": 2, "fx": b"ab", "m": {"a": 1}, "us": [uuid]}
        fields.update(changes)
        message = typed(**fields)
        if "w" not in changes:
            message.w.value = 5
        return bytes(serialize(message, VALUE_CONTEXT))

    unset_w = typed(u=uuid, kind=1, fx=b"abcd")
    values = [
        value(),
        bytes(serialize(unset_w, VALUE_CONTEXT)),
        value(u="nope"),
        value(kind=0),  # "unknown" is not one of the Enum8's names
        value(fx=b"abcde"),  # longer than FixedString(4)
    ]
    batch = decode(decoder(registry, PROTO_TYPED), values)
    assert batch.rows.select(list(PROTO_TYPED)).to_pylist() == [
        {
            "u": uuid.lower(),
            "kind": "view",
            "fx": b"ab\x00\x00",
            "m": [("a", 1)],
            "us": [uuid.lower()],
            "w": 5,
        },
        {"u": uuid.lower(), "kind": "click", "fx": b"abcd", "m": [], "us": [], "w": None},
    ]
    found = errors(batch)
    assert found[2].startswith("column 'u': ") and "a UUID" in found[2]
    assert found[3].startswith("column 'kind': ") and "one of the Enum's names" in found[3]
    assert found[4].startswith("column 'fx': ") and "at most 4 bytes long" in found[4]
    assert len(found) == 3


def test_a_schema_with_a_reference_resolves_it_from_the_registry(
    registry: SchemaRegistryService,
) -> None:
    f = descriptor_pb2.FieldDescriptorProto
    dep = descriptor_pb2.FileDescriptorProto(name="lib/dep.proto", package="lib", syntax="proto3")
    dep.message_type.add(name="Inner").field.add(
        name="x", number=1, type=f.TYPE_INT64, label=f.LABEL_OPTIONAL
    )
    main = descriptor_pb2.FileDescriptorProto(name="app/main.proto", package="app", syntax="proto3")
    main.dependency.append("lib/dep.proto")
    outer = main.message_type.add(name="Outer")
    outer.field.add(name="id", number=1, type=f.TYPE_INT64, label=f.LABEL_OPTIONAL)
    outer.field.add(
        name="inner", number=2, type=f.TYPE_MESSAGE, type_name=".lib.Inner", label=f.LABEL_OPTIONAL
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(dep)
    pool.Add(main)
    cls = message_factory.GetMessageClass(pool.FindMessageTypeByName("app.Outer"))
    client = SchemaRegistryClient({"url": registry.url})
    serialize = proto_serializer(client, cls)
    values = [bytes(serialize(cls(id=i), VALUE_CONTEXT)) for i in range(3)]
    assert "lib/dep.proto" in client.get_subjects()  # registered as a reference
    batch = decode(decoder(registry, {"id": "Int64"}), values)
    assert batch.bad == 0 and batch.rows.column("id").to_pylist() == [0, 1, 2]
