"""`format = "avro"`: Confluent-framed records through a registry process of the dev stack
(confluent-kafka's client and serializer on both sides), and plain records of a schema file."""

from __future__ import annotations

import datetime as dt
import io
import json
import threading
from pathlib import Path
from typing import Any

import fastavro
import pyarrow as pa
import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient

from devstack.process import running
from devstack.schema_registry import SchemaRegistryService
from hakafka.consumer import ColumnSpec, Format, PipelineSchema, make_decoder
from hakafka.consumer.errors import SchemaError
from hakafka.consumer.registry import RegistrySettings, RegistryUnavailableError
from tests.formats import (
    AVRO_TYPED,
    AVRO_TYPED_WRITER,
    AVRO_V1,
    AVRO_V2,
    COLUMNS,
    UUID_TEXT,
    VALUE_CONTEXT,
    avro_event,
    avro_serializer,
    avro_typed_record,
    declared,
    decode,
    errors,
    expected_row,
    registry,
    serializer_for,
)

__all__ = ["registry"]  # the fixture

SCHEMA = PipelineSchema.of(COLUMNS.items())


def registry_decoder(registry: SchemaRegistryService, schema: PipelineSchema = SCHEMA) -> Any:
    return make_decoder(Format.AVRO, schema, registry=RegistrySettings(registry.url))


def test_two_writer_versions_interleaved_keep_kafka_order_and_evolve(
    registry: SchemaRegistryService,
) -> None:
    client = SchemaRegistryClient({"url": registry.url})
    v1, v2 = serializer_for("avro", client, version=1), serializer_for("avro", client, version=2)
    values = [(v2 if i % 3 == 0 else v1)(i) for i in range(300)]
    batch = decode(registry_decoder(registry), values)
    assert batch.bad == 0
    assert declared(batch) == [expected_row(i, note=i % 3 == 0) for i in range(300)]
    assert batch.rows.column("_offset").to_pylist() == list(range(300))
    assert client.get_versions("events-value") == [1, 2]


def test_bad_inputs_are_dead_letters_with_their_reason(registry: SchemaRegistryService) -> None:
    client = SchemaRegistryClient({"url": registry.url})
    good = serializer_for("avro", client, version=1)
    ok = good(10)
    values = [
        good(0),
        b"\x01" + ok[1:],  # wrong magic byte
        b"\x00\x00\x00\x03\xe7" + ok[5:],  # schema id 999: unknown
        ok[:-1],  # cut short
        ok + b"\x00",  # a byte left over
        b"\x00\x00",  # shorter than the header
        good(6),
    ]
    batch = decode(registry_decoder(registry), values)
    assert declared(batch) == [expected_row(0, note=False), expected_row(6, note=False)]
    assert errors(batch) == {
        1: "wrong magic byte 1 (expected 0): not in the Confluent wire format",
        2: "unknown schema id 999: the schema registry has no such schema",
        3: "the Avro record is cut short (writer schema 1)",
        4: "1 bytes left after the Avro record (writer schema 1)",
        5: "message of 2 bytes is shorter than the 5-byte Confluent header (magic byte, schema id)",
    }


def test_a_writer_that_does_not_fit_the_columns_dead_letters_its_records(
    registry: SchemaRegistryService,
) -> None:
    client = SchemaRegistryClient({"url": registry.url})
    values = [serializer_for("avro", client, version=1)(i) for i in range(3)]
    note_required = PipelineSchema.of({**COLUMNS, "note": "String"}.items())
    batch = decode(registry_decoder(registry, note_required), values)
    assert batch.good == 0
    assert set(errors(batch).values()) == {
        "writer schema 1 has no field 'note' for required column 'note'"
    }
    id_as_date = PipelineSchema.of({**COLUMNS, "id": "Date"}.items())
    batch = decode(registry_decoder(registry, id_as_date), values)
    assert set(errors(batch).values()) == {
        "writer schema 1: field 'id' (int) does not fit column 'id' Date"
    }


def test_promotions_int_to_double_and_string_to_bytes_and_overflow(
    registry: SchemaRegistryService,
) -> None:
    client = SchemaRegistryClient({"url": registry.url})
    writer = {
        "type": "record",
        "name": "P",
        "fields": [
            {"name": "small", "type": "int"},
            {"name": "text", "type": "string"},
            {"name": "raw", "type": "bytes"},
        ],
    }
    serialize = avro_serializer(client, writer)
    values = [
        serialize({"small": small, "text": "é", "raw": b"ab"}, VALUE_CONTEXT) for small in (1, 300)
    ]
    as_int8 = PipelineSchema.of([("small", "Int8"), ("text", "String"), ("raw", "String")])
    as_double = PipelineSchema.of([("small", "Float64"), ("text", "String"), ("raw", "String")])
    batch = decode(registry_decoder(registry, as_double), values)
    assert batch.rows.select(["small", "text", "raw"]).to_pylist() == [
        {"small": 1.0, "text": "é", "raw": "ab"},
        {"small": 300.0, "text": "é", "raw": "ab"},
    ]
    batch = decode(registry_decoder(registry, as_int8), values)  # 300 does not fit Int8
    assert batch.rows.column("small").to_pylist() == [1]
    assert "300" in errors(batch)[1]


def test_a_registry_that_cannot_answer_raises_and_decides_nothing(
    registry: SchemaRegistryService,
) -> None:
    client = SchemaRegistryClient({"url": registry.url})
    values = [serializer_for("avro", client, version=1)(i) for i in range(3)]
    decoder = registry_decoder(registry)
    registry.stop()
    with pytest.raises(RegistryUnavailableError, match="unreachable for schema id 1"):
        decode(decoder, values)
    registry.start()
    batch = decode(decoder, values)  # the same batch, once it is back: all good
    assert (batch.good, batch.bad) == (3, 0)


def test_plain_avro_with_a_schema_file(tmp_path: Path) -> None:
    path = tmp_path / "event.avsc"
    path.write_text(json.dumps(AVRO_V2))
    parsed = fastavro.parse_schema(AVRO_V2)
    values = []
    for i in range(50):
        out = io.BytesIO()
        fastavro.schemaless_writer(
            out, parsed, {"id": i, "kind": "buy", "amount": 1.5, "note": "x"}
        )
        values.append(out.getvalue())
    values[7] = values[7][:-1]
    decoder = make_decoder(Format.AVRO, SCHEMA, schema_file=path)
    batch = decode(decoder, values)
    assert batch.good == 49 and batch.rows.column("id").to_pylist() == [
        i for i in range(50) if i != 7
    ]
    assert errors(batch) == {7: f"the Avro record is cut short (schema_file {path})"}
    assert batch.rows.schema.field("amount").type == pa.float64()


def test_a_record_cut_short_mid_batch_is_a_dead_letter_and_its_neighbours_keep_their_values(
    tmp_path: Path,
) -> None:
    # Bodies were read as one Avro block, checked only at its end: the cut record (its
    # double one byte short) took the next one's first byte, the rest were read out of
    # step, and here the misreading ended exactly at the block's end (in 272 of 300 random
    # batches like it). No dead letter, and rows with wrong values went to ClickHouse.
    path = tmp_path / "event.avsc"
    path.write_text(json.dumps(AVRO_V1))
    parsed = fastavro.parse_schema(AVRO_V1)
    ids = [74607, 8272, 33433, 0, 15456, 64938]
    bodies = []
    for i in ids:
        out = io.BytesIO()
        fastavro.schemaless_writer(out, parsed, avro_event(i, note=False))
        bodies.append(out.getvalue()[:-1] if i == 0 else out.getvalue())
    batch = decode(make_decoder(Format.AVRO, SCHEMA, schema_file=path), bodies)
    assert errors(batch) == {3: f"the Avro record is cut short (schema_file {path})"}
    assert batch.rows.select(["id", "kind", "amount"]).to_pylist() == [
        avro_event(i, note=False) for i in ids if i != 0
    ]


def test_an_unusable_schema_file_or_missing_source_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "bad.avsc"
    path.write_text('{"type": "string"}')
    with pytest.raises(SchemaError, match="must be an Avro record schema"):
        make_decoder(Format.AVRO, SCHEMA, schema_file=path)
    with pytest.raises(SchemaError, match="needs either a schema registry or a schema_file"):
        make_decoder(Format.AVRO, SCHEMA)
    with pytest.raises(SchemaError, match="'protobuf' needs a schema registry"):
        make_decoder(Format.PROTOBUF, SCHEMA)


def test_the_clickhouse_types_from_avro_are_converted_and_checked_like_json(
    registry: SchemaRegistryService,
) -> None:
    client = SchemaRegistryClient({"url": registry.url})
    serialize = avro_serializer(client, AVRO_TYPED_WRITER)
    values = [
        serialize(avro_typed_record(), VALUE_CONTEXT),
        serialize(avro_typed_record(u="not-a-uuid"), VALUE_CONTEXT),
        serialize(avro_typed_record(ip4="300.1.1.1"), VALUE_CONTEXT),
        serialize(avro_typed_record(j="[1, 2]"), VALUE_CONTEXT),
        serialize(avro_typed_record(us=["x"]), VALUE_CONTEXT),
    ]
    batch = decode(registry_decoder(registry, PipelineSchema.of(AVRO_TYPED.items())), values)
    (row,) = batch.rows.select(list(AVRO_TYPED)).to_pylist()
    assert row == {
        "u": UUID_TEXT.lower(),
        "ip4": "10.0.0.1",
        "ip6": "2001:db8::1",
        "kind": "view",
        "fx": b"ab\x00\x00",
        "m": [("a", 1), ("b", 2)],
        "t": {"a": 7, "b": "seven"},
        "n": [{"x": 1, "y": "one"}, {"x": 2, "y": "two"}],
        "j": '{"k": [1, 2]}',
        "d": dt.date(2024, 2, 29),
        "us": [UUID_TEXT.lower()],
    }
    found = errors(batch)
    assert found[1].startswith("column 'u': ") and "a UUID" in found[1]
    assert found[2].startswith("column 'ip4': ") and "an IPv4 address" in found[2]
    assert found[3].startswith("column 'j': ") and "a JSON object" in found[3]
    assert found[4].startswith("column 'us'[0]: ") and "a UUID" in found[4]
    assert len(found) == 4


def test_a_column_path_is_refused_for_avro(registry: SchemaRegistryService) -> None:
    schema = PipelineSchema((ColumnSpec("id", "Int64", path="user.id"),))
    with pytest.raises(SchemaError, match=r"a path \('user\.id'\) is read from JSON messages"):
        registry_decoder(registry, schema)


def test_basic_auth_is_sent_and_refused_credentials_are_an_outage(tmp_path: Path) -> None:
    service = SchemaRegistryService(tmp_path / "registry", auth=("svc", "s3cret"))
    with running(service):
        client = SchemaRegistryClient({"url": service.url, "basic.auth.user.info": "svc:s3cret"})
        values = [serializer_for("avro", client, version=1)(i) for i in range(3)]
        good = RegistrySettings(service.url, "svc", "s3cret")
        batch = decode(make_decoder(Format.AVRO, SCHEMA, registry=good), values)
        assert (batch.good, batch.bad) == (3, 0)
        wrong = RegistrySettings(service.url, "svc", "wrong")
        refused = make_decoder(Format.AVRO, SCHEMA, registry=wrong)
        with pytest.raises(RegistryUnavailableError, match="HTTP status code 401") as raised:
            decode(refused, values)
        assert "wrong" not in str(raised.value) and "s3cret" not in str(raised.value)


def test_one_decoder_decodes_in_two_threads_at_once(registry: SchemaRegistryService) -> None:
    # The flush lane's Kafka re-fetch and the consume lane share the term's decoder.
    client = SchemaRegistryClient({"url": registry.url})
    v1, v2 = serializer_for("avro", client, version=1), serializer_for("avro", client, version=2)
    batches = [
        [v1(i) for i in range(2000)] + [v1(0)[:-1]],  # one bad record: bisection, many parses
        [v2(i) for i in range(2000)] + [v2(0)[:-1]],
    ]
    decoder = registry_decoder(registry)
    alone = [declared(decode(decoder, b)) for b in batches]
    failures: list[str] = []

    def run(which: int) -> None:
        for _ in range(20):
            if declared(decode(decoder, batches[which])) != alone[which]:
                failures.append(f"batch {which} decoded differently")

    threads = [threading.Thread(target=run, args=(w,)) for w in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(t.is_alive() for t in threads) and failures == []
