"""The ClickHouse types of #26 from Avro and Protobuf input against the real engine (chdb
behind the HTTP front) and real Spark: serialized by confluent-kafka's serializers, decoded,
flushed, and read back through `read_table` with equal values (the JSON side of the same
round trip is in test_pipeline_types_clickhouse.py)."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from pyspark.sql import SparkSession

from chlib import Replica, TableSpec, ensure_table
from devstack.clickhouse import ClickHouseService
from devstack.schema_registry import SchemaRegistryService
from hakafka.consumer import Format, PipelineSchema, make_decoder
from hakafka.consumer.registry import RegistrySettings
from spark_bridge.flush import FlushTarget, flush_block
from spark_bridge.reader import read_table
from spark_bridge.runtime import prepare_session
from tests.formats import (
    AVRO_TYPED,
    AVRO_TYPED_WRITER,
    PROTO_TYPED,
    UUID_TEXT,
    VALUE_CONTEXT,
    avro_serializer,
    avro_typed_record,
    decode,
    proto_serializer,
    proto_typed_class,
    registry,
)

pytestmark = [pytest.mark.integration, pytest.mark.spark]
__all__ = ["registry"]  # the fixture

ROWS = 30
UUID = UUID_TEXT.lower()


def avro_values(client: SchemaRegistryClient) -> tuple[list[bytes], list[dict[str, Any]]]:
    """Avro messages of the typed writer and what `read_table` must give back for each."""
    serialize = avro_serializer(client, AVRO_TYPED_WRITER)
    values, expected = [], []
    for i in range(ROWS):
        record = avro_typed_record(
            kind=("click", "view")[i % 2],
            m={f"k{j}": i * 10 + j for j in range(i % 3)},
            t={"a": -i, "b": f"s{i}"},
            n=[{"x": j, "y": f"y{j}"} for j in range(i % 3)],
            j=json.dumps({"k": i, "list": [1, "two"]}),
            d=dt.date(2024, 1, 1) + dt.timedelta(days=i),
        )
        values.append(bytes(serialize(record, VALUE_CONTEXT)))
        expected.append(
            {
                "u": UUID,
                "ip4": "10.0.0.1",
                "ip6": "2001:db8::1",
                "kind": record["kind"],
                "fx": b"ab\x00\x00",
                "m": record["m"],
                "t": record["t"],
                "n": record["n"],
                "j": {"k": i, "list": [1, "two"]},
                "d": record["d"],
                "us": [UUID],
            }
        )
    return values, expected


def proto_values(client: SchemaRegistryClient) -> tuple[list[bytes], list[dict[str, Any]]]:
    """Protobuf messages of the typed class and what `read_table` must give back for each."""
    typed = proto_typed_class()
    serialize = proto_serializer(client, typed)
    values, expected = [], []
    for i in range(ROWS):
        message = typed(u=UUID_TEXT, kind=1 + i % 2, fx=b"abcd"[: i % 5], us=[UUID] * (i % 2))
        message.m.update({f"k{j}": i * 10 + j for j in range(i % 3)})
        if i % 3:
            message.w.value = -i
        values.append(bytes(serialize(message, VALUE_CONTEXT)))
        expected.append(
            {
                "u": UUID,
                "kind": ("click", "view")[i % 2],
                "fx": b"abcd"[: i % 5].ljust(4, b"\0"),
                "m": {f"k{j}": i * 10 + j for j in range(i % 3)},
                "us": [UUID] * (i % 2),
                "w": -i if i % 3 else None,
            }
        )
    return values, expected


@pytest.mark.parametrize(
    ("fmt", "columns", "produce"),
    [
        (Format.AVRO, AVRO_TYPED, avro_values),
        (Format.PROTOBUF, PROTO_TYPED, proto_values),
    ],
)
def test_new_types_round_trip_from_the_format_through_clickhouse_and_read_table(
    fmt: Format,
    columns: dict[str, str],
    produce: Callable[[SchemaRegistryClient], tuple[list[bytes], list[dict[str, Any]]]],
    *,
    spark: SparkSession,
    clickhouse: ClickHouseService,
    ch_database: str,
    ch_client: Any,
    registry: SchemaRegistryService,
) -> None:
    prepare_session(spark)
    values, expected = produce(SchemaRegistryClient({"url": registry.url}))
    schema = PipelineSchema.of(list(columns.items()))
    decoder = make_decoder(fmt, schema, registry=RegistrySettings(registry.url))
    decoded = decode(decoder, values)
    assert decoded.bad == 0, decoded.dead_letters
    table = f"typed_{fmt.value}"
    spec = TableSpec(ch_database, table, tuple(schema.clickhouse_columns()), "(_offset)")
    assert ensure_table(ch_client, spec) is True

    class Block:
        block_id = "b1"

        def to_table(self) -> pa.Table:
            return pa.Table.from_batches([decoded.rows])

    target = FlushTarget(
        ch_database, table, (Replica("r1", clickhouse.host, clickhouse.port),), "pipe"
    )
    assert flush_block(spark, Block(), target).rows == ROWS
    df = read_table(spark, table, hosts=[(clickhouse.host, clickhouse.port)], database=ch_database)
    got = sorted((r.asDict(recursive=True) for r in df.collect()), key=lambda r: r["_offset"])
    assert [r.pop("_offset") for r in got] == list(range(ROWS))
    for row in got:
        row.pop("_partition")
        if "j" in row:
            row["j"] = json.loads(row["j"])
    assert got == expected
