"""The ClickHouse types beyond numbers, strings and dates (UUID, IPv4/IPv6, Enum, FixedString,
JSON, Map, Tuple, Nested) and nested field paths: their Arrow mapping, their decoding from
JSON and CSV, and bad values as dead letters naming the column and the value's position."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pytest

from buffer import Catalog, MemoryTable, OffsetRange, SqlEngine
from chlib.chtypes import split_type, text_type
from hakafka.consumer import (
    DecodeOptions,
    Format,
    OnError,
    PipelineSchema,
    SchemaError,
    arrow_type,
    make_decoder,
)
from hakafka.consumer.schema import ColumnSpec, parse_path
from tests.formats import message_columns

UUID = "123e4567-e89b-12d3-a456-426614174000"
TYPES = [
    ("u", "UUID"),
    ("e", "Enum8('a' = 1, 'b' = -2)"),
    ("e16", "Enum16('x y' = 1000, 'it\\'s' = 2)"),
    ("ip4", "IPv4"),
    ("ip6", "IPv6"),
    ("fs", "FixedString(4)"),
    ("m", "Map(String, UInt32)"),
    ("tn", "Tuple(a Int32, b String)"),
    ("tu", "Tuple(Int32, String)"),
    ("n", "Nested(a Int32, b UUID)"),
    ("j", "JSON"),
    ("ids", "Array(Nullable(UUID))"),
]


def record(i: int = 0) -> dict[str, Any]:
    return {
        "u": UUID.upper(),
        "e": "b",
        "e16": "x y",
        "ip4": f"10.0.0.{i % 256}",
        "ip6": "2001:DB8:0::1",
        "fs": "ab",
        "m": {"k": i, "z": 7},
        "tn": {"a": i, "b": "s"},
        "tu": [i, "t"],
        "n": [{"a": 1, "b": UUID}, {"a": 2, "b": None}],
        "j": {"x": {"y": [1, 2]}, "s": "é"},
        "ids": [UUID, None],
    }


def decode(
    values: Sequence[bytes | str],
    schema: PipelineSchema | None = None,
    fmt: Format = Format.JSON,
) -> tuple[list[dict[str, Any]], dict[int, str]]:
    decoder = make_decoder(fmt, schema or PipelineSchema.of(TYPES), DecodeOptions())
    out = decoder.decode_columns(message_columns(values))
    rows = out.rows.to_pylist()
    dead = {}
    if out.dead_letters is not None:
        dead = dict(
            zip(
                out.dead_letters["_offset"].to_pylist(),
                out.dead_letters["_error"].to_pylist(),
                strict=True,
            )
        )
    return rows, dead


@pytest.mark.parametrize(
    ("ch_type", "arrow"),
    [
        ("UUID", pa.string()),
        ("IPv4", pa.string()),
        ("IPv6", pa.string()),
        ("Enum8('a' = 1)", pa.string()),
        ("FixedString(16)", pa.binary(16)),
        ("JSON", pa.string()),
        ("Map(String, Array(UInt8))", pa.map_(pa.string(), pa.list_(pa.uint8()))),
        ("Map(UInt64, Nullable(String))", pa.map_(pa.uint64(), pa.string())),
        ("Tuple(a Int32, b String)", pa.struct([("a", pa.int32()), ("b", pa.string())])),
        ("Tuple(Int32, Date)", pa.struct([("1", pa.int32()), ("2", pa.date32())])),
        (
            "Nested(a Int32, `b` String)".replace("`", ""),
            pa.list_(pa.struct([("a", pa.int32()), ("b", pa.string())])),
        ),
        ("LowCardinality(Nullable(UUID))", pa.string()),
    ],
)
def test_new_types_map_to_their_arrow_form(ch_type: str, arrow: pa.DataType) -> None:
    assert arrow_type(ch_type).arrow == arrow


@pytest.mark.parametrize(
    ("ch_type", "why"),
    [
        ("Enum8('a' = 300)", "not in -128..127"),
        ("Enum8(a = 1)", "not 'name' = number"),
        ("FixedString(0)", "N >= 1"),
        ("Map(Nullable(String), Int8)", "Map key type"),
        ("Nullable(Array(Int8))", "not allowed"),
        ("Nullable(JSON)", "not allowed"),
        ("Tuple(a Int8, String)", "all named"),
        ("Nested(Int8)", "all named"),
        ("Variant(Int8, String)", "unsupported type"),
        ("Tuple(a Int8, a String)", "names must differ"),
    ],
)
def test_malformed_new_types_are_refused_naming_the_column_and_why(ch_type: str, why: str) -> None:
    with pytest.raises(SchemaError, match=rf"column 'c': ClickHouse type .*{why}"):
        PipelineSchema.of([("c", ch_type)])


def test_type_text_splits_at_top_level_outside_quotes_and_reads_as_text() -> None:
    assert split_type("Enum8('a,b' = 1, 'c)' = 2)") == ("Enum8", ["'a,b' = 1", "'c)' = 2"])
    assert text_type("Map(String, Nested(a UUID, b Int8))") == (
        "Map(String, Array(Tuple(a String, b Int8)))"
    )
    assert text_type("Array(Nullable(IPv4))") == "Array(Nullable(String))"
    assert text_type("Decimal(10, 2)") == "Decimal(10, 2)"


def test_paths_parse_to_keys_and_indexes_and_malformed_ones_are_refused() -> None:
    assert parse_path("user.id") == ("user", "id")
    assert parse_path("items[0].sku") == ("items", 0, "sku")
    assert parse_path("a[1][2]") == ("a", 1, 2)
    for bad in ("", ".a", "a..b", "a[x]", "[0]", "a.[0]"):
        with pytest.raises(ValueError, match="is not keys joined by"):
            parse_path(bad)
    with pytest.raises(SchemaError, match=r"column 'c': path 'a\.\.b'"):
        PipelineSchema((ColumnSpec("c", "Int8", path="a..b"),))


def test_every_new_type_decodes_from_json_to_its_arrow_form() -> None:
    rows, dead = decode([json.dumps(record(i)) for i in range(3)])
    assert dead == {}
    first = rows[0]
    assert first["u"] == UUID  # lower-cased, as ClickHouse prints it
    assert (first["e"], first["e16"], first["ip4"]) == ("b", "x y", "10.0.0.0")
    assert first["ip6"] == "2001:db8::1"
    assert first["fs"] == b"ab\x00\x00"  # zero-padded, as ClickHouse stores it
    assert first["m"] == [("k", 0), ("z", 7)]
    assert first["tn"] == {"a": 0, "b": "s"}
    assert first["tu"] == {"1": 0, "2": "t"}
    assert first["n"] == [{"a": 1, "b": UUID}, {"a": 2, "b": None}]
    assert json.loads(first["j"]) == {"x": {"y": [1, 2]}, "s": "é"}
    assert first["ids"] == [UUID, None]
    assert [r["m"][0][1] for r in rows] == [0, 1, 2]


def bad(field: str, value: Any) -> str:
    return json.dumps({**record(), field: value})


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("u", "not-a-uuid", "column 'u' (JSON /u): expected UUID, got string \"not-a-uuid\""),
        (
            "e",
            "c",
            "column 'e' (JSON /e): expected Enum8('a' = 1, 'b' = -2), got string \"c\"",
        ),
        ("ip4", "1.2.3.256", "column 'ip4' (JSON /ip4): expected IPv4, got string \"1.2.3.256\""),
        ("ip4", "1.2.3", "column 'ip4' (JSON /ip4): expected IPv4, got string \"1.2.3\""),
        (
            "ip6",
            "2001:db8::g",
            "column 'ip6' (JSON /ip6): expected IPv6, got string \"2001:db8::g\"",
        ),
        ("fs", "abcde", "column 'fs' (JSON /fs): expected FixedString(4), got string \"abcde\""),
        ("fs", "ééé", "column 'fs' (JSON /fs): expected FixedString(4), got string \"ééé\""),
        ("j", [1], "column 'j' (JSON /j): expected JSON, got array [1]"),
        (
            "tu",
            [1, "x", 3],
            "column 'tu' (JSON /tu): expected Tuple(Int32, String), got array [1, \"x\", 3]",
        ),
        ("m", {"k": -1}, "column 'm' (JSON /m/k): cannot convert -1 to UInt32"),
        ("ids", [UUID, None, "x"], "column 'ids' (JSON /ids/2): expected UUID, got string \"x\""),
        (
            "n",
            [{"a": 1, "b": UUID}, {"a": 2, "b": "y"}],
            "column 'n' (JSON /n/1/b): expected UUID, got string \"y\"",
        ),
    ],
)
def test_a_value_that_does_not_fit_its_type_is_a_dead_letter_naming_column_and_position(
    field: str, value: Any, reason: str
) -> None:
    values = [json.dumps(record(i)) for i in range(6)]
    values[4] = bad(field, value)
    rows, dead = decode(values)
    assert len(rows) == 5
    assert dead == {4: reason}


def test_map_and_tuple_bad_values_inside_containers_name_the_entry() -> None:
    schema = PipelineSchema.of(
        [("m", "Map(String, Array(IPv4))"), ("t", "Tuple(a Enum8('x' = 1))")]
    )
    good = json.dumps({"m": {"k": ["1.1.1.1"]}, "t": {"a": "x"}})
    rows, dead = decode(
        [good, json.dumps({"m": {"k": ["1.1.1.1", "300.1.1.1"]}, "t": {"a": "x"}}), good],
        schema,
    )
    assert len(rows) == 2
    assert dead == {1: "column 'm' (JSON /m/k/1): expected IPv4, got string \"300.1.1.1\""}
    rows, dead = decode([good, json.dumps({"m": {}, "t": {"a": "y"}})], schema)
    assert dead == {1: "column 't' (JSON /t/a): expected Enum8('x' = 1), got string \"y\""}
    assert rows == [{"m": [("k", ["1.1.1.1"])], "t": {"a": "x"}, "_partition": 0, "_offset": 0}]


def test_nested_paths_read_values_inside_objects_and_arrays() -> None:
    schema = PipelineSchema(
        (
            ColumnSpec("user_id", "UInt64", path="user.id"),
            ColumnSpec("city", "Nullable(String)", path="user.address.city"),
            ColumnSpec("first_sku", "Nullable(String)", path="items[0].sku"),
            ColumnSpec("second_tag", "Nullable(UUID)", path="items[1].tags[0]"),
            ColumnSpec("attrs", "Map(String, String)", required=False, path="user.attrs"),
            ColumnSpec("name", "String"),
        )
    )
    values = [
        {
            "user": {"id": 7, "address": {"city": "Oslo"}, "attrs": {"a": "b"}, "x": 1},
            "items": [{"sku": "s1"}, {"sku": "s2", "tags": [UUID.upper()]}],
            "name": "n0",
        },
        {"user": {"id": 8, "address": None}, "items": [], "name": "n1"},
        {"user": {"id": 9}, "name": "n2"},
        {"user": None, "name": "n3"},  # user.id is required: a dead letter
    ]
    rows, dead = decode([json.dumps(v) for v in values], schema)
    assert dead == {3: "required field 'user_id' is missing or null"}
    picked = [
        (r["user_id"], r["city"], r["first_sku"], r["second_tag"], r["attrs"], r["name"])
        for r in rows
    ]
    assert picked == [
        (7, "Oslo", "s1", UUID, [("a", "b")], "n0"),
        (8, None, None, None, None, "n1"),
        (9, None, None, None, None, "n2"),
    ]


def test_a_wrongly_typed_value_on_a_path_is_a_dead_letter() -> None:
    schema = PipelineSchema((ColumnSpec("user_id", "UInt64", path="user.id"),))
    rows, dead = decode(['{"user": {"id": 1}}', '{"user": 5}', '{"user": {"id": "x"}}'], schema)
    assert [r["user_id"] for r in rows] == [1]
    assert set(dead) == {1, 2}


@pytest.mark.parametrize(
    ("paths", "overlap"),
    [
        ({"a": "user", "b": "user.id"}, "'a' (path user) and 'b' (path user.id)"),
        ({"a": "user.id", "b": "user"}, "'a' (path user.id) and 'b' (path user)"),
        ({"a": "x.y", "b": "x.y"}, "'a' (path x.y) and 'b' (path x.y)"),
        ({"a": "x[0]", "b": "x.k"}, "'a' (path x[0]) and 'b' (path x.k)"),
    ],
)
def test_overlapping_paths_are_refused_naming_both_columns(
    paths: dict[str, str], overlap: str
) -> None:
    schema = PipelineSchema.of([("a", "String"), ("b", "String")], paths=paths)
    with pytest.raises(SchemaError, match=re.escape(f"columns {overlap} overlap")):
        make_decoder(Format.JSON, schema)


@pytest.mark.parametrize("fmt", [Format.CSV, Format.RAW])
def test_paths_are_only_read_from_json(fmt: Format) -> None:
    schema = PipelineSchema((ColumnSpec("v", "String", path="a.b"),))
    with pytest.raises(SchemaError, match=r"column 'v': a path \(a\.b\) is only read from"):
        make_decoder(fmt, schema)


def test_csv_reads_the_text_types_and_refuses_containers() -> None:
    schema = PipelineSchema.of(
        [
            ("u", "UUID"),
            ("ip", "IPv4"),
            ("e", "Enum8('a' = 1)"),
            ("fs", "FixedString(3)"),
            ("j", "JSON"),
        ]
    )
    rows, dead = decode(
        [
            f'{UUID},1.2.3.4,a,xy,"{{""k"":1}}"',
            f"{UUID},1.2.3.4,b,xy,{{}}",
            f"{UUID},1.2.3.4,a,xy,[1]",
        ],
        schema,
        Format.CSV,
    )
    assert [(r["u"], r["ip"], r["e"], r["fs"], r["j"]) for r in rows] == [
        (UUID, "1.2.3.4", "a", b"xy\x00", '{"k":1}')
    ]
    assert dead == {
        1: "column 'e' (CSV field 3): cannot convert \"b\" to Enum8('a' = 1)",
        2: "column 'j' (CSV field 5): cannot convert \"[1]\" to JSON",
    }
    with pytest.raises(SchemaError, match="cannot be read from CSV"):
        make_decoder(Format.CSV, PipelineSchema.of([("m", "Map(String, Int8)")]))


def test_fail_policy_names_the_offset_and_the_bad_value() -> None:
    decoder = make_decoder(
        Format.JSON, PipelineSchema.of([("u", "UUID")]), DecodeOptions(on_error=OnError.FAIL)
    )
    with pytest.raises(
        Exception, match=r"offset 11: column 'u' \(JSON /u\): expected UUID, got string \"nope\""
    ):
        decoder.decode_columns(message_columns([f'{{"u": "{UUID}"}}', '{"u": "nope"}'], first=10))


def test_ipv6_decodes_to_the_text_clickhouse_prints() -> None:
    # Pairs checked against ClickHouse's toString(toIPv6(...)) in
    # tests/pipeline/test_pipeline_types_clickhouse.py.
    written = {
        "2001:DB8:0:0::1": "2001:db8::1",
        "::ffff:1.2.3.4": "::ffff:1.2.3.4",
        "10.1.2.3": "::ffff:10.1.2.3",
        "::1.2.3.4": "::1.2.3.4",
        "::0.0.1.2": "::102",
        "::1": "::1",
        "64:ff9b::1.2.3.4": "64:ff9b::102:304",
    }
    schema = PipelineSchema.of([("ip", "IPv6")])
    rows, dead = decode([json.dumps({"ip": ip}) for ip in [*written, "fe80::1%eth0"]], schema)
    assert [r["ip"] for r in rows] == list(written.values())
    assert dead == {7: "column 'ip' (JSON /ip): expected IPv6, got string \"fe80::1%eth0\""}


def test_the_query_buffer_takes_the_new_types_and_sql_reads_inside_them() -> None:
    schema = PipelineSchema.of(TYPES)
    decoded = make_decoder(Format.JSON, schema).decode_columns(
        message_columns([json.dumps(record(i)) for i in range(3)])
    )
    table = MemoryTable("typed", schema.arrow_schema(), limit_bytes=1 << 20)
    table.append(decoded.rows, {k: OffsetRange(*v) for k, v in decoded.ranges.items()})
    catalog = Catalog()
    catalog.add(table)
    engine = SqlEngine(catalog)
    try:
        result = engine.query(
            "SELECT u, m['k'] AS k, tn.b AS b, tu['1'] AS t1, n[2].b AS nb, fs, "
            "json_extract(j, '$.x.y[1]')::INT AS y FROM typed ORDER BY _offset"
        )
    finally:
        engine.close()
    assert result.to_pylist() == [
        {"u": UUID, "k": i, "b": "s", "t1": i, "nb": None, "fs": b"ab\0\0", "y": 2}
        for i in range(3)
    ]


def test_a_nullable_enum_takes_null_and_missing_values() -> None:
    schema = PipelineSchema.of([("e", "Nullable(Enum8('a' = 1))")])
    rows, dead = decode(['{"e": "a"}', '{"e": null}', "{}"], schema)
    assert dead == {}
    assert [r["e"] for r in rows] == ["a", None, None]
