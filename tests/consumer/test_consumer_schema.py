"""ClickHouse type mapping and pipeline schemas."""

from __future__ import annotations

import pyarrow as pa
import pytest

from hakafka.consumer import (
    DEAD_LETTER_COLUMNS,
    ColumnSpec,
    PipelineSchema,
    SchemaError,
    arrow_type,
    dead_letter_arrow_schema,
)


@pytest.mark.parametrize(
    ("ch_type", "arrow", "nullable"),
    [
        ("Int8", pa.int8(), False),
        ("UInt64", pa.uint64(), False),
        ("Float32", pa.float32(), False),
        ("Bool", pa.bool_(), False),
        ("String", pa.string(), False),
        ("Nullable(String)", pa.string(), True),
        ("LowCardinality(Nullable(String))", pa.string(), True),
        ("Date", pa.date32(), False),
        ("Date32", pa.date32(), False),
        ("DateTime", pa.timestamp("s"), False),
        ("DateTime('Europe/Berlin')", pa.timestamp("s", tz="Europe/Berlin"), False),
        ("DateTime64(3)", pa.timestamp("ms"), False),
        ("DateTime64(6, 'UTC')", pa.timestamp("us", tz="UTC"), False),
        ("DateTime64(9)", pa.timestamp("ns"), False),
        ("Decimal(18, 4)", pa.decimal128(18, 4), False),
        ("Decimal64(2)", pa.decimal128(18, 2), False),
        ("Array(Nullable(Int32))", pa.list_(pa.int32()), False),
        ("Array(Array(String))", pa.list_(pa.list_(pa.string())), False),
    ],
)
def test_supported_types_map_to_arrow(ch_type: str, arrow: pa.DataType, nullable: bool) -> None:
    mapped = arrow_type(ch_type)
    assert mapped.arrow == arrow
    assert mapped.nullable is nullable


@pytest.mark.parametrize(
    "ch_type",
    [
        "Variant(Int8, String)",
        "Dynamic",
        "Object('json')",
        "Nullable(Nullable(Int8))",
        "Int33",
        "DateTime64(12)",
        "Decimal(50, 2)",
        "DateTime(UTC)",
        "Array(Int8",
    ],
)
def test_unsupported_types_are_rejected_naming_column_and_type(ch_type: str) -> None:
    with pytest.raises(SchemaError, match=rf"column 'price'.*{ch_type.split('(', maxsplit=1)[0]}"):
        PipelineSchema.of([("price", ch_type)])


def test_arrow_schema_has_declared_then_meta_columns_with_partition_and_offset_always() -> None:
    schema = PipelineSchema.of([("id", "UInt32"), ("name", "Nullable(String)")], ["_key"])
    assert schema.arrow_schema().names == ["id", "name", "_partition", "_offset", "_key"]
    assert schema.clickhouse_columns() == [
        ("id", "UInt32"),
        ("name", "Nullable(String)"),
        ("_partition", "Int32"),
        ("_offset", "Int64"),
        ("_key", "Nullable(String)"),
    ]
    assert schema.arrow_schema().field("_key").type == pa.binary()


def test_required_defaults_to_not_nullable_and_can_be_relaxed() -> None:
    assert ColumnSpec("a", "Int32").is_required
    assert not ColumnSpec("a", "Nullable(Int32)").is_required
    assert not ColumnSpec("a", "Int32", required=False).is_required
    with pytest.raises(SchemaError, match="required=True contradicts Nullable"):
        PipelineSchema((ColumnSpec("a", "Nullable(Int32)", required=True),))


@pytest.mark.parametrize(
    ("columns", "meta", "message"),
    [
        ((), (), "at least one declared column"),
        ((ColumnSpec("_x", "Int8"),), (), "reserved for meta columns"),
        ((ColumnSpec("a", "Int8"), ColumnSpec("a", "Int8")), (), "declared twice"),
        ((ColumnSpec("a", "Int8"),), ("_headers",), "meta column '_headers' is unknown"),
    ],
)
def test_bad_schemas_are_rejected(
    columns: tuple[ColumnSpec, ...], meta: tuple[str, ...], message: str
) -> None:
    with pytest.raises(SchemaError, match=message):
        PipelineSchema(columns, meta)


def test_dead_letter_columns_and_arrow_schema_agree() -> None:
    names = [name for name, _ in DEAD_LETTER_COLUMNS]
    assert names == ["_topic", "_partition", "_offset", "_timestamp", "_key", "_value", "_error"]
    schema = dead_letter_arrow_schema()
    assert schema.names == names
    assert schema.field("_value").type == pa.binary()
    assert dict(DEAD_LETTER_COLUMNS)["_value"] == "String"
