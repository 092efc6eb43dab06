"""Decoders: fast path, isolation of bad messages, dead letters, on_error policies."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
from collections.abc import Sequence

import pyarrow as pa
import pytest

from hakafka.consumer import (
    DecodeError,
    DecodeOptions,
    Format,
    MessageColumns,
    OnError,
    PipelineSchema,
    SchemaError,
    make_decoder,
)

SCHEMA = PipelineSchema.of(
    [("id", "Int64"), ("name", "String"), ("score", "Nullable(Float64)"), ("day", "Date")],
    ["_topic", "_timestamp", "_key"],
)


def columns(
    values: Sequence[bytes | None], *, partition: int = 0, first: int = 100, topic: str = "events"
) -> MessageColumns:
    n = len(values)
    return MessageColumns(
        topics=[topic] * n,
        partitions=[partition] * n,
        offsets=list(range(first, first + n)),
        timestamps=[1_700_000_000_000 + i for i in range(n)],
        keys=[b"k%d" % i for i in range(n)],
        values=list(values),
    )


def good(i: int) -> bytes:
    return json.dumps({"id": i, "name": f"n{i}", "score": i / 2, "day": "2024-03-01"}).encode()


def dead_by_offset(batch_dead: pa.RecordBatch | None) -> dict[int, str]:
    assert batch_dead is not None
    return dict(
        zip(batch_dead["_offset"].to_pylist(), batch_dead["_error"].to_pylist(), strict=True)
    )


def test_json_fast_path_builds_rows_with_meta_columns_in_kafka_order() -> None:
    decoded = make_decoder(Format.JSON, SCHEMA).decode_columns(columns([good(i) for i in range(5)]))
    rows = decoded.rows
    assert rows.schema == SCHEMA.arrow_schema()
    assert rows["id"].to_pylist() == [0, 1, 2, 3, 4]
    assert rows["day"].to_pylist() == [dt.date(2024, 3, 1)] * 5
    assert rows["_offset"].to_pylist() == [100, 101, 102, 103, 104]
    assert rows["_partition"].to_pylist() == [0] * 5
    assert rows["_topic"].to_pylist() == ["events"] * 5
    assert rows["_key"].to_pylist() == [b"k0", b"k1", b"k2", b"k3", b"k4"]
    assert rows["_timestamp"][1].as_py() == dt.datetime(2023, 11, 14, 22, 13, 20, 1000)
    assert decoded.dead_letters is None
    assert (decoded.good, decoded.bad) == (5, 0)
    assert decoded.ranges == {("events", 0): (100, 104)}


def test_mixed_batch_yields_good_rows_in_order_and_exact_dead_letters() -> None:
    values: list[bytes | None] = [good(i) for i in range(12)]
    values[2] = b'{"id": "two", "name": "x", "day": "2024-03-01"}'  # type mismatch
    values[5] = b'{"name": "no id", "day": "2024-03-01"}'  # required field missing
    values[6] = b'{"id": null, "name": "null id", "day": "2024-03-01"}'  # required null
    values[7] = b'{"id": 7, "name": "\xff\xfe", "day": "2024-03-01"}'  # invalid UTF-8
    values[9] = b"{not json"
    values[11] = b""  # empty
    decoded = make_decoder(Format.JSON, SCHEMA).decode_columns(columns(values))
    assert decoded.rows["id"].to_pylist() == [0, 1, 3, 4, 8, 10]
    assert decoded.rows["_offset"].to_pylist() == [100, 101, 103, 104, 108, 110]
    dead = dead_by_offset(decoded.dead_letters)
    assert sorted(dead) == [102, 105, 106, 107, 109, 111]
    assert dead[102] == "column 'id' (JSON /id): expected Int64, got string \"two\""
    assert dead[105] == "required field 'id' is missing or null"
    assert dead[106] == "required field 'id' is missing or null"
    assert dead[107] == "invalid UTF-8 at byte 19: invalid start byte"
    assert (
        dead[109] == "not valid JSON at byte 1: Expecting property name enclosed in double quotes"
    )
    assert dead[111].startswith("empty message")
    assert decoded.dead_letters is not None
    raw = dict(
        zip(
            decoded.dead_letters["_offset"].to_pylist(),
            decoded.dead_letters["_value"].to_pylist(),
            strict=True,
        )
    )
    assert raw[107] == values[7]
    assert decoded.dead_letters["_key"].to_pylist()[0] == b"k2"
    assert (decoded.good, decoded.bad) == (6, 6)
    assert decoded.ranges == {("events", 0): (100, 111)}  # bad messages count for the checkpoint


def test_oversized_messages_are_dead_letters_naming_size_and_limit() -> None:
    big = json.dumps({"id": 1, "name": "x" * 500, "day": "2024-03-01"}).encode()
    decoder = make_decoder(Format.JSON, SCHEMA, DecodeOptions(max_message_bytes=200))
    decoded = decoder.decode_columns(columns([good(0), big, good(2)]))
    assert decoded.rows["id"].to_pylist() == [0, 2]
    assert dead_by_offset(decoded.dead_letters) == {
        101: f"message of {len(big)} bytes exceeds max_message_bytes 200"
    }


def test_dead_letters_keep_the_first_bytes_with_the_length_and_hash_of_the_rest() -> None:
    # A 3 MiB bad value (and a 2 KiB key) was kept whole: a flood of them filled the buffer.
    huge = b"{" + b"x" * (3 << 20)
    batch = columns([good(0), huge, b"not json"])
    batch.keys[1] = b"K" * 2048
    options = DecodeOptions(max_message_bytes=4 << 20, dead_letter_bytes=1024)
    dead = make_decoder(Format.JSON, SCHEMA, options).decode_columns(batch).dead_letters
    assert dead is not None
    assert dead["_value"].to_pylist() == [huge[:1024], b"not json"]
    assert dead["_key"].to_pylist() == [b"K" * 1024, b"k2"]
    assert dead.nbytes < 8 << 10
    errors = dead_by_offset(dead)
    assert errors[101].endswith(
        f" [_key truncated: first 1024 of 2048 bytes kept, sha256 "
        f"{hashlib.sha256(b'K' * 2048).hexdigest()}]"
        f" [_value truncated: first 1024 of {len(huge)} bytes kept, sha256 "
        f"{hashlib.sha256(huge).hexdigest()}]"
    )
    assert "truncated" not in errors[102]


def test_integer_overflow_and_bad_date_are_type_errors() -> None:
    schema = PipelineSchema.of([("small", "Int8"), ("day", "Nullable(Date)")])
    values = [
        b'{"small": 1}',
        b'{"small": 300}',
        b'{"small": 2, "day": "2024-01-01 10:00:00"}',
        b'{"small": 3, "day": "2024-01-02"}',
    ]
    decoded = make_decoder(Format.JSON, schema).decode_columns(columns(values))
    assert decoded.rows["small"].to_pylist() == [1, 3]
    assert decoded.rows["day"].to_pylist() == [None, dt.date(2024, 1, 2)]
    assert dead_by_offset(decoded.dead_letters) == {
        101: "column 'small' (JSON /small): cannot convert 300 to Int8",
        102: "column 'day' (JSON /day): expected Date, got string \"2024-01-01 10:00:00\"",
    }


def test_raw_newlines_are_legal_only_between_tokens() -> None:
    pretty = b'{\n  "id": 1,\r\n  "name": "pretty",\n  "day": "2024-03-01"\n}'
    newline_in_string = b'{"id": 2, "name": "a\nb", "day": "2024-03-01"}'
    two_objects = good(3) + b" " + good(4)
    decoded = make_decoder(Format.JSON, SCHEMA).decode_columns(
        columns([good(0), pretty, newline_in_string, two_objects, good(5)])
    )
    assert decoded.rows["id"].to_pylist() == [0, 1, 5]
    assert decoded.rows["name"].to_pylist() == ["n0", "pretty", "n5"]
    dead = dead_by_offset(decoded.dead_letters)
    assert sorted(dead) == [102, 103]
    assert dead[103] == "message holds 2 records, expected exactly one"


def test_one_bad_message_among_ten_thousand_is_isolated() -> None:
    values: list[bytes | None] = [good(i) for i in range(10_000)]
    values[6_789] = b'{"id": 1.5, "name": "float id", "day": "2024-03-01"}'
    decoded = make_decoder(Format.JSON, SCHEMA).decode_columns(columns(values, first=0))
    assert decoded.rows.num_rows == 9_999
    assert dead_by_offset(decoded.dead_letters).keys() == {6_789}
    assert decoded.rows["id"].to_pylist() == [i for i in range(10_000) if i != 6_789]


def test_unknown_fields_are_ignored_and_optional_fields_default_to_null() -> None:
    decoded = make_decoder(Format.JSON, SCHEMA).decode_columns(
        columns([b'{"id": 1, "name": "a", "day": "2024-03-01", "extra": [1, {"x": 2}]}'])
    )
    assert decoded.rows["score"].to_pylist() == [None]
    assert decoded.bad == 0


def test_skip_policy_drops_bad_messages_and_counts_them() -> None:
    decoder = make_decoder(Format.JSON, SCHEMA, DecodeOptions(on_error=OnError.SKIP))
    decoded = decoder.decode_columns(columns([good(0), b"nope", good(2)]))
    assert decoded.rows["_offset"].to_pylist() == [100, 102]
    assert decoded.dead_letters is None
    assert decoded.bad == 1
    assert decoded.ranges == {("events", 0): (100, 102)}


def test_fail_policy_raises_naming_the_first_bad_offset() -> None:
    decoder = make_decoder(Format.JSON, SCHEMA, DecodeOptions(on_error=OnError.FAIL))
    with pytest.raises(
        DecodeError, match=r"cannot decode events\[3\] offset 101: not valid JSON at byte 0: "
    ):
        decoder.decode_columns(columns([good(0), b"nope", b"also bad"], partition=3))


def test_ranges_cover_each_partition_of_an_interleaved_batch() -> None:
    n = 6
    cols = MessageColumns(
        topics=["t"] * n,
        partitions=[0, 1, 0, 1, 2, 0],
        offsets=[5, 40, 6, 41, 7, 7],
        timestamps=[-1] * n,
        keys=[None] * n,
        values=[good(i) for i in range(n)],
    )
    decoded = make_decoder(Format.JSON, SCHEMA).decode_columns(cols)
    assert decoded.ranges == {("t", 0): (5, 7), ("t", 1): (40, 41), ("t", 2): (7, 7)}
    assert decoded.rows["_partition"].to_pylist() == [0, 1, 0, 1, 2, 0]
    assert decoded.rows["_timestamp"][0].as_py() == dt.datetime(1970, 1, 1)


def test_raw_decoder_keeps_the_value_and_rejects_invalid_utf8() -> None:
    schema = PipelineSchema.of([("line", "String")])
    decoded = make_decoder(Format.RAW, schema).decode_columns(
        columns([b"hello", b"multi\nline", b"\xc3\x28", "h\u00e9".encode()])
    )
    assert decoded.rows["line"].to_pylist() == ["hello", "multi\nline", "h\u00e9"]
    assert list(dead_by_offset(decoded.dead_letters)) == [102]
    with pytest.raises(SchemaError, match="exactly one declared column of type String"):
        make_decoder(Format.RAW, PipelineSchema.of([("n", "Int32")]))


def test_csv_decoder_parses_typed_fields_and_isolates_bad_rows() -> None:
    schema = PipelineSchema.of(
        [("id", "UInt32"), ("name", "String"), ("at", "DateTime64(3)"), ("ok", "Nullable(Bool)")]
    )
    values = [
        b"1,alice,2024-01-01 00:00:00.250,true",
        b'2,"bob, ""the"" builder",2024-01-02T00:00:00,',
        b"x,carol,2024-01-03 00:00:00,false",  # id not a number
        b"4,dave",  # too few fields
        b'5,"multi\nline",2024-01-05 00:00:00,false',
    ]
    decoded = make_decoder(Format.CSV, schema).decode_columns(columns(values))
    assert decoded.rows["id"].to_pylist() == [1, 2, 5]
    assert decoded.rows["name"].to_pylist() == ["alice", 'bob, "the" builder', "multi\nline"]
    assert decoded.rows["at"][0].as_py() == dt.datetime(2024, 1, 1, 0, 0, 0, 250000)
    assert decoded.rows["ok"].to_pylist() == [True, None, False]
    assert sorted(dead_by_offset(decoded.dead_letters)) == [102, 103]


def test_decoding_an_empty_batch_gives_an_empty_typed_batch() -> None:
    decoded = make_decoder(Format.JSON, SCHEMA).decode_columns(columns([]))
    assert decoded.rows.num_rows == 0
    assert decoded.rows.schema == SCHEMA.arrow_schema()
    assert decoded.ranges == {}


def test_array_of_dates_is_cast_and_checked() -> None:
    schema = PipelineSchema.of([("days", "Array(Date)")])
    decoded = make_decoder(Format.JSON, schema).decode_columns(
        columns([b'{"days": ["2024-01-01", "2024-01-02"]}', b'{"days": ["2024-01-01 01:00:00"]}'])
    )
    assert decoded.rows["days"].to_pylist() == [[dt.date(2024, 1, 1), dt.date(2024, 1, 2)]]
    assert dead_by_offset(decoded.dead_letters) == {
        101: "column 'days' (JSON /days/0): expected Date, got string \"2024-01-01 01:00:00\""
    }


@pytest.mark.parametrize(
    ("format", "schema", "values", "kept", "dead"),
    [
        (
            Format.JSON,
            SCHEMA,
            [good(0), good(1) + b" " + good(2), b" \t ", b"\n", good(3)],
            [(0, 100), (3, 104)],
            {
                101: "message holds 2 records, expected exactly one",
                102: "message holds only whitespace, expected a JSON object",
                103: "message holds only whitespace, expected a JSON object",
            },
        ),
        (
            Format.CSV,
            PipelineSchema.of([("id", "UInt32"), ("name", "String")]),
            [b"1,a", b"2,b\n3,c", b"\r\n", b"4,d"],
            [(1, 100), (4, 103)],
            {
                101: "message holds 2 records, expected exactly one",
                102: "message holds only line breaks, expected a CSV record",
            },
        ),
    ],
)
def test_two_records_beside_an_empty_line_never_shift_rows_onto_wrong_offsets(
    format: Format,
    schema: PipelineSchema,
    values: list[bytes],
    kept: list[tuple[int, int]],
    dead: dict[int, str],
) -> None:
    # Arrow reads two records in one message as two rows and a blank line as none: together
    # they would still add up to one row per message, each on the wrong offset.
    decoded = make_decoder(format, schema).decode_columns(columns(values))
    rows = decoded.rows
    assert list(zip(rows["id"].to_pylist(), rows["_offset"].to_pylist(), strict=True)) == kept
    assert dead_by_offset(decoded.dead_letters) == dead


@pytest.mark.parametrize("first", [True, False])
def test_a_json_null_message_is_a_dead_letter_not_a_row_or_a_crash(first: bool) -> None:
    # pyarrow's read_json segfaults on a chunk that starts with `null` and turns a later
    # `null` into a row of nulls, which an all-Nullable schema would accept.
    schema = PipelineSchema.of([("id", "Nullable(Int64)")])
    values = [b" null\n", b'{"id": 1}', b"nope", b"null {}", b'{"id": 2}']
    if not first:
        values = values[1:] + values[:1]
    decoded = make_decoder(Format.JSON, schema).decode_columns(columns(values))
    assert decoded.rows["id"].to_pylist() == [1, 2]
    dead = dead_by_offset(decoded.dead_letters)
    null_offsets = [100 + i for i, v in enumerate(values) if v.lstrip().startswith(b"null")]
    assert sorted(dead) == sorted([*null_offsets, 100 + values.index(b"nope")])
    for offset in null_offsets:
        assert dead[offset] == "JSON value is null, expected an object"


CSV_PAIR = PipelineSchema.of([("id", "UInt32"), ("name", "String")])


def csv_rows(decoded_rows: pa.RecordBatch) -> list[tuple[int, str, int]]:
    return list(
        zip(
            decoded_rows["id"].to_pylist(),
            decoded_rows["name"].to_pylist(),
            decoded_rows["_offset"].to_pylist(),
            strict=True,
        )
    )


def test_csv_null_is_what_clickhouse_reads_as_null_and_nan_is_a_float() -> None:
    # Arrow's default null list made "nan" and "NA" NULL silently (ClickHouse reads nan as NaN
    # and refuses NA as a number).
    schema = PipelineSchema.of([("n", "Nullable(Int64)"), ("x", "Nullable(Float64)")])
    values = [b"1,nan", b"2,-inf", rb"\N,\N", b",", b"NA,1", b"3,NA", b"4,null"]
    decoded = make_decoder(Format.CSV, schema).decode_columns(columns(values))
    got = list(zip(decoded.rows["n"].to_pylist(), decoded.rows["x"].to_pylist(), strict=True))
    assert got[0][0] == 1 and math.isnan(got[0][1])
    assert got[1:] == [(2, -math.inf), (None, None), (None, None)]
    assert decoded.rows["_offset"].to_pylist() == [100, 101, 102, 103]
    assert sorted(dead_by_offset(decoded.dead_letters)) == [104, 105, 106]


def test_csv_unclosed_quote_never_swallows_the_next_message() -> None:
    # Arrow reads `1,"abc` on into the next message up to its quote: one record of two
    # messages; the two-record message after them made the row count match, so rows moved
    # onto the wrong offsets.
    values = [b'1,"abc', b'2,x"', b"3,y\n4,z", b"5,w"]
    decoded = make_decoder(Format.CSV, CSV_PAIR).decode_columns(columns(values))
    assert csv_rows(decoded.rows) == [(2, 'x"', 101), (5, "w", 103)]
    assert dead_by_offset(decoded.dead_letters) == {
        100: "unclosed quote opened at byte 2, expected one CSV record",
        102: "message holds 2 records, expected exactly one",
    }


def test_csv_message_is_one_record_or_a_dead_letter_naming_why() -> None:
    values: list[bytes | None] = [
        b'1,"multi\nline"',  # a quoted line break is part of the field
        b'2,"crlf\r\ninside"',
        b"3,trailing lf\n",
        b"4,trailing crlf\r\n",
        b'5,"say ""hi"""',  # doubled quotes inside a quoted field
        b'6,ab"c',  # a quote inside an unquoted field is a plain character
        b'7,"closed"then"more',  # after the closing quote the field goes on unquoted
        b"8,a\n9,b",
        b"8,a\r9,b",  # a bare CR ends a record too
        b"8,a\r\n9,b",
        b"8,a\n\n9,b",
        b'8,"a""',  # the last quote is escaped: still open
        b'8,"a\n9,b',
        b"",
        b"\r\n",
        b"10,last",
    ]
    decoded = make_decoder(Format.CSV, CSV_PAIR).decode_columns(columns(values))
    assert csv_rows(decoded.rows) == [
        (1, "multi\nline", 100),
        (2, "crlf\r\ninside", 101),
        (3, "trailing lf", 102),
        (4, "trailing crlf", 103),
        (5, 'say "hi"', 104),
        (6, 'ab"c', 105),
        (7, 'closedthen"more', 106),
        (10, "last", 115),
    ]
    two = "message holds 2 records, expected exactly one"
    assert dead_by_offset(decoded.dead_letters) == {
        107: two,
        108: two,
        109: two,
        110: two,
        111: "unclosed quote opened at byte 2, expected one CSV record",
        112: "unclosed quote opened at byte 2, expected one CSV record",
        113: "empty message (null or zero-length value)",
        114: "message holds only line breaks, expected a CSV record",
    }


TRICKY_CSV = [
    b"1,plain",
    b'2,"quoted, with comma"',
    b'3,"open',
    b"4,x\n5,y",
    b'6,"nl\ninside"',
    b'7,"a""',
    b'8,mid"quote',
    b"9,cr\r",
    b'"10",x',
    b'11,"x\n12,"y"',  # one record: the quote closes before y
    b"\n13,leading lf",
    b"14,a\n ",
]


@pytest.mark.parametrize("shift", range(len(TRICKY_CSV)))
def test_csv_each_message_decodes_in_a_batch_as_it_does_alone(shift: int) -> None:
    values = TRICKY_CSV[shift:] + TRICKY_CSV[:shift]
    decoder = make_decoder(Format.CSV, CSV_PAIR)
    decoded = decoder.decode_columns(columns(values))
    rows = {offset: (ident, name) for ident, name, offset in csv_rows(decoded.rows)}
    dead = dead_by_offset(decoded.dead_letters)
    for offset, value in enumerate(values, start=100):
        alone = decoder.decode_columns(columns([value], first=offset))
        if alone.good:
            assert rows[offset] == tuple(alone.rows.to_pylist()[0][k] for k in ("id", "name"))
            assert offset not in dead
        else:
            assert dead[offset] == dead_by_offset(alone.dead_letters)[offset]
            assert offset not in rows
    assert (decoded.good, decoded.bad) == (8, 4)


def test_csv_one_unclosed_quote_among_ten_thousand_is_isolated() -> None:
    values: list[bytes | None] = [b"%d,n%d" % (i, i) for i in range(10_000)]
    for i in (0, 4_321, 9_999):
        values[i] = b'%d,"q%d"' % (i, i)
    values[6_789] = b'6789,"open'
    decoded = make_decoder(Format.CSV, CSV_PAIR).decode_columns(columns(values, first=0))
    assert decoded.rows["_offset"].to_pylist() == [i for i in range(10_000) if i != 6_789]
    assert decoded.rows["name"].to_pylist()[4_321] == "q4321"
    assert dead_by_offset(decoded.dead_letters) == {
        6_789: "unclosed quote opened at byte 5, expected one CSV record"
    }


def test_csv_record_rule_follows_the_configured_delimiter() -> None:
    decoder = make_decoder(Format.CSV, CSV_PAIR, DecodeOptions(csv_delimiter=";"))
    decoded = decoder.decode_columns(columns([b'1;"a;b"', b'2;"open', b"3;c,d"]))
    assert csv_rows(decoded.rows) == [(1, "a;b", 100), (3, "c,d", 102)]
    assert dead_by_offset(decoded.dead_letters) == {
        101: "unclosed quote opened at byte 2, expected one CSV record"
    }


def test_csv_fail_policy_names_the_offset_of_an_unclosed_quote() -> None:
    decoder = make_decoder(Format.CSV, CSV_PAIR, DecodeOptions(on_error=OnError.FAIL))
    with pytest.raises(DecodeError, match=r"events\[0\] offset 101: unclosed quote opened"):
        decoder.decode_columns(columns([b"1,a", b'2,"b', b"3,c"]))


@pytest.mark.parametrize("delimiter", ['"', "\n", "\r", ";;", "\u00a7"])
def test_csv_delimiter_is_one_ascii_character_not_a_quote_or_a_line_break(delimiter: str) -> None:
    with pytest.raises(ValueError, match="csv_delimiter must be one ASCII character other than"):
        DecodeOptions(csv_delimiter=delimiter)
