"""Dead-letter reasons of type errors name the column, where its value was read (a JSON
Pointer, a CSV field's position) and what was expected and found; a message that is not
JSON at all says at which byte it stops being JSON."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import fastavro
import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from hypothesis import given, settings
from hypothesis import strategies as st

from devstack.schema_registry import SchemaRegistryService
from hakafka.consumer import (
    DecodeError,
    DecodeOptions,
    Format,
    OnError,
    PipelineSchema,
    make_decoder,
)
from hakafka.consumer.registry import RegistrySettings
from hakafka.consumer.schema import ColumnSpec
from tests.formats import COLUMNS, decode, errors, message_columns, registry, serializer_for

__all__ = ["registry"]  # the fixture

JSON_SCHEMA = PipelineSchema(
    (
        ColumnSpec("user_id", "UInt64", path="user.id"),
        ColumnSpec("amount", "Nullable(Int64)"),
        ColumnSpec("name", "Nullable(String)"),
        ColumnSpec("small", "Nullable(Int8)"),
        ColumnSpec("at", "Nullable(DateTime64(3))"),
        ColumnSpec("day", "Nullable(Date)"),
        ColumnSpec("price", "Nullable(Decimal(10, 2))"),
        ColumnSpec("tags", "Array(LowCardinality(String))", required=False),
        ColumnSpec("sku", "Nullable(String)", path="items[0].sku"),
        ColumnSpec("codes", "Map(UInt8, String)", required=False),
        ColumnSpec("odd", "Nullable(Int8)", path="a/b.c~d"),
    )
)
UUID = "123e4567-e89b-12d3-a456-426614174000"
GOOD = {"user": {"id": 1}, "amount": 2, "name": "n", "at": "2024-01-01 10:00:00.250"}


def reasons(fmt: Format, schema: PipelineSchema, bad: bytes, good: bytes) -> dict[int, str]:
    """The dead letters of `bad` between two `good` messages (so bisection isolates it)."""
    out = make_decoder(fmt, schema).decode_columns(message_columns([good, bad, good], first=100))
    assert out.good == 2
    assert out.dead_letters is not None
    return dict(
        zip(
            out.dead_letters["_offset"].to_pylist(),
            out.dead_letters["_error"].to_pylist(),
            strict=True,
        )
    )


def json_reason(message: dict[str, Any] | str) -> str:
    bad = message if isinstance(message, str) else json.dumps(message, ensure_ascii=False)
    found = reasons(Format.JSON, JSON_SCHEMA, bad.encode(), json.dumps(GOOD).encode())
    assert list(found) == [101]
    return found[101]


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (  # a string where a number is expected, on a nested path
            {"user": {"id": "abc"}},
            "column 'user_id' (JSON /user/id): expected UInt64, got string \"abc\"",
        ),
        (  # a number where a string is expected
            {"name": 5},
            "column 'name' (JSON /name): expected String, got number 5",
        ),
        ({"amount": 1.7}, "column 'amount' (JSON /amount): cannot convert 1.7 to Int64"),
        ({"amount": 1.0}, "column 'amount' (JSON /amount): cannot convert 1.0 to Int64"),
        ({"amount": True}, "column 'amount' (JSON /amount): expected Int64, got boolean true"),
        (
            {"amount": 2**64},
            "column 'amount' (JSON /amount): cannot convert 18446744073709551616 to Int64",
        ),
        ({"small": 300}, "column 'small' (JSON /small): cannot convert 300 to Int8"),
        (  # an object where a scalar is expected
            {"name": {"first": "a"}},
            'column \'name\' (JSON /name): expected String, got object {"first": "a"}',
        ),
        (  # an array where the path needs an object
            {"user": [1]},
            "column 'user_id' (JSON /user/id): expected an object at /user, got array [1]",
        ),
        (
            {"user": 7},
            "column 'user_id' (JSON /user/id): expected an object at /user, got number 7",
        ),
        (
            {"at": "2024-13-01"},
            "column 'at' (JSON /at): cannot convert \"2024-13-01\" to DateTime64(3)",
        ),
        (
            {"at": 1_700_000_000},
            "column 'at' (JSON /at): expected DateTime64(3), got number 1700000000",
        ),
        (
            {"day": "2024-01-01 10:00:00"},
            "column 'day' (JSON /day): expected Date, got string \"2024-01-01 10:00:00\"",
        ),
        ({"day": "2024-02-30"}, "column 'day' (JSON /day): cannot convert \"2024-02-30\" to Date"),
        ({"price": 1.234}, "column 'price' (JSON /price): cannot convert 1.234 to Decimal(10, 2)"),
        (
            {"price": "cheap"},
            "column 'price' (JSON /price): cannot convert \"cheap\" to Decimal(10, 2)",
        ),
        (  # an item of an array: the pointer goes down to it
            {"tags": ["a", 5]},
            "column 'tags' (JSON /tags/1): expected String, got number 5",
        ),
        (
            {"tags": "a"},
            "column 'tags' (JSON /tags): expected Array(LowCardinality(String)), got string \"a\"",
        ),
        (  # Arrow reads every item of an array on the path, not only the one it picks
            {"items": [{"sku": "a"}, {"sku": 3}]},
            "column 'sku' (JSON /items/0/sku): expected String at /items/1/sku, got number 3",
        ),
        (
            {"items": [{"sku": ["a"]}]},
            "column 'sku' (JSON /items/0/sku): expected String, got array [\"a\"]",
        ),
        (
            {"items": {"sku": "a"}},
            "column 'sku' (JSON /items/0/sku): expected an array at /items, got object "
            '{"sku": "a"}',
        ),
        (
            {"codes": {"7": "ok", "x": "bad"}},
            "column 'codes' (JSON /codes/x): expected UInt8 (a Map key), got string \"x\"",
        ),
        ({"codes": {"7": 7}}, "column 'codes' (JSON /codes/7): expected String, got number 7"),
        (  # keys holding / and ~ are escaped as JSON Pointer escapes them
            {"a/b": {"c~d": "x"}},
            "column 'odd' (JSON /a~1b/c~0d): expected Int8, got string \"x\"",
        ),
        (
            {"name": 1, "amount": "first declared column first"},
            "column 'amount' (JSON /amount): expected Int64, got string "
            '"first declared column first"',
        ),
        (
            {"amount": "x" * 100},
            f"column 'amount' (JSON /amount): expected Int64, got string \"{'x' * 60}...",
        ),
    ],
)
def test_a_json_type_error_names_the_column_the_pointer_and_what_was_found(
    change: dict[str, Any], reason: str
) -> None:
    assert json_reason({**GOOD, **change}) == reason


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        (
            '{"amount": 1,}',
            "not valid JSON at byte 13: Expecting property name enclosed in double quotes",
        ),
        ('{"name": "\u00e9\u00e9", "amount": x}', "not valid JSON at byte 27: Expecting value"),
        ('{"amount": 1', "not valid JSON at byte 12: Expecting ',' delimiter"),
        ('{"amount": 1} {"amount": "x"}', "not valid JSON at byte 14: Extra data"),
        ("[1, 2]", "expected a JSON object, got array [1, 2]"),
        ('"text"', 'expected a JSON object, got string "text"'),
    ],
)
def test_a_message_that_is_not_one_json_object_says_where_or_what_it_is(
    message: str, reason: str
) -> None:
    assert json_reason(message) == reason


def test_the_fail_policy_raises_with_the_same_reason_and_the_offset() -> None:
    decoder = make_decoder(Format.JSON, JSON_SCHEMA, DecodeOptions(on_error=OnError.FAIL))
    bad = json.dumps({**GOOD, "amount": 1.7}).encode()
    with pytest.raises(DecodeError) as raised:
        decoder.decode_columns(message_columns([json.dumps(GOOD).encode(), bad], first=41))
    assert str(raised.value) == (
        "cannot decode t[0] offset 42: column 'amount' (JSON /amount): cannot convert 1.7 to Int64"
    )


def test_a_bad_message_among_many_keeps_its_reason_and_every_good_row() -> None:
    good = json.dumps(GOOD).encode()
    values = [good] * 5000
    values[1234] = json.dumps({**GOOD, "user": {"id": -5}}).encode()
    out = make_decoder(Format.JSON, JSON_SCHEMA).decode_columns(message_columns(values))
    assert out.good == 4999
    assert out.dead_letters is not None
    assert out.dead_letters["_offset"].to_pylist() == [1234]
    assert out.dead_letters["_error"].to_pylist() == [
        "column 'user_id' (JSON /user/id): cannot convert -5 to UInt64"
    ]


EVERY_KIND = PipelineSchema(
    (
        ColumnSpec("uid", "Nullable(UInt64)", path="user.id"),
        ColumnSpec("i", "Nullable(Int8)"),
        ColumnSpec("f", "Nullable(Float32)"),
        ColumnSpec("s", "Nullable(String)"),
        ColumnSpec("b", "Nullable(Bool)"),
        ColumnSpec("t", "Nullable(DateTime)"),
        ColumnSpec("d", "Nullable(Date)"),
        ColumnSpec("dec", "Nullable(Decimal(6, 2))"),
        ColumnSpec("u", "Nullable(UUID)"),
        ColumnSpec("arr", "Array(Nullable(Int16))", required=False),
        ColumnSpec("tup", "Tuple(x Int8, y String)", required=False),
        ColumnSpec("sku", "Nullable(String)", path="items[1].sku"),
        ColumnSpec("m", "Map(UInt8, Array(IPv4))", required=False),
        ColumnSpec("j", "JSON", required=False),
        ColumnSpec("pt", "Tuple(Int8, Date)", required=False),
        ColumnSpec("fs", "Nullable(FixedString(2))"),
    )
)
EVERY_KIND_MESSAGE: dict[str, Any] = {
    "user": {"id": 5},
    "i": 1,
    "f": 1.5,
    "s": "x",
    "b": True,
    "t": "2024-01-01 10:00:00",
    "d": "2024-01-01",
    "dec": 1.25,
    "u": UUID,
    "arr": [1, None, 3],
    "tup": {"x": 1, "y": "s"},
    "items": [{"sku": "a"}, {"sku": "b"}],
    "m": {"7": ["1.2.3.4"]},
    "j": {"k": [1]},
    "pt": [1, "2024-01-01"],
    "fs": "ab",
}
JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**65), 2**65)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from(
        [
            *("", "ab", "abc", "1", "1.234", "{}", UUID, "1.2.3.4", "300.1.1.1"),
            *("2024-01-01", "2024-01-01 10:00:00", "2024-13-01"),
        ]
    ),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.sampled_from(["x", "y", "7", "300", "id", "sku"]), inner, max_size=3)
    ),
    max_leaves=6,
)


@settings(max_examples=150, deadline=None)
@given(key=st.sampled_from(sorted(EVERY_KIND_MESSAGE)), value=JSON_VALUES)
def test_a_json_message_refused_for_one_value_has_a_reason_naming_that_column(
    key: str, value: Any
) -> None:
    # The reason comes from reading the message again with the `json` module: it must find
    # the value Arrow (or a check) refused, never another one, and never fall back to
    # Arrow's own text, which names no column.
    message = json.dumps({**EVERY_KIND_MESSAGE, key: value}).encode()
    out = make_decoder(Format.JSON, EVERY_KIND).decode_columns(message_columns([message]))
    if out.good:
        return
    assert out.dead_letters is not None
    column = {"user": "uid", "items": "sku"}.get(key, key)
    assert out.dead_letters["_error"][0].as_py().startswith(f"column {column!r} (JSON /")


CSV_SCHEMA = PipelineSchema.of(
    [
        ("id", "UInt32"),
        ("name", "String"),
        ("at", "Nullable(DateTime64(3))"),
        ("ok", "Nullable(Bool)"),
        ("day", "Nullable(Date)"),
        ("u", "Nullable(UUID)"),
    ]
)


@pytest.mark.parametrize(
    ("record", "reason"),
    [
        (f"x,a,,,,{UUID}", "column 'id' (CSV field 1): cannot convert \"x\" to UInt32"),
        (f"-1,a,,,,{UUID}", "column 'id' (CSV field 1): cannot convert \"-1\" to UInt32"),
        (f"1.5,a,,,,{UUID}", "column 'id' (CSV field 1): cannot convert \"1.5\" to UInt32"),
        (
            f"1,a,2024-13-01,,,{UUID}",
            "column 'at' (CSV field 3): cannot convert \"2024-13-01\" to DateTime64(3)",
        ),
        (f"1,a,,maybe,,{UUID}", "column 'ok' (CSV field 4): cannot convert \"maybe\" to Bool"),
        (
            f"1,a,,,2024-01-01 10:00:00,{UUID}",
            "column 'day' (CSV field 5): cannot convert \"2024-01-01 10:00:00\" to Date",
        ),
        ('1,"a, b",,,,nope', "column 'u' (CSV field 6): cannot convert \"nope\" to UUID"),
    ],
)
def test_a_csv_field_that_does_not_convert_names_the_column_and_its_position(
    record: str, reason: str
) -> None:
    found = reasons(Format.CSV, CSV_SCHEMA, record.encode(), f"1,a,,,,{UUID}".encode())
    assert found == {101: reason}


def test_avro_names_the_column_whose_value_does_not_convert(tmp_path: Path) -> None:
    writer = {
        "type": "record",
        "name": "R",
        "fields": [
            {"name": "small", "type": "int"},
            {"name": "xs", "type": {"type": "array", "items": "long"}},
        ],
    }
    path = tmp_path / "r.avsc"
    path.write_text(json.dumps(writer))
    parsed = fastavro.parse_schema(writer)

    def record(small: int, xs: list[int]) -> bytes:
        out = io.BytesIO()
        fastavro.schemaless_writer(out, parsed, {"small": small, "xs": xs})
        return out.getvalue()

    schema = PipelineSchema.of([("small", "Int8"), ("xs", "Array(Nullable(Int8))")])
    decoder = make_decoder(Format.AVRO, schema, schema_file=path)
    batch = decode(decoder, [record(1, [1]), record(300, [1]), record(2, [1, 300]), record(3, [])])
    assert batch.rows.column("small").to_pylist() == [1, 3]
    assert errors(batch) == {
        1: "column 'small': cannot convert 300 to Int8",
        2: "column 'xs': cannot convert [1, 300] to Array(Nullable(Int8))",
    }


def test_protobuf_names_the_column_whose_value_does_not_convert(
    registry: SchemaRegistryService,
) -> None:
    client = SchemaRegistryClient({"url": registry.url})
    event = serializer_for("protobuf", client, version=1)
    schema = PipelineSchema.of({**COLUMNS, "id": "Int8"}.items())
    decoder = make_decoder(Format.PROTOBUF, schema, registry=RegistrySettings(registry.url))
    batch = decode(decoder, [event(1), event(300), event(2)])
    assert batch.rows.column("id").to_pylist() == [1, 2]
    assert errors(batch) == {1: "column 'id': cannot convert 300 to Int8"}
