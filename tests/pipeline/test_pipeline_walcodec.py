"""A consumed batch survives the WAL byte for byte, with and without dead letters; its header
names the rows schema (older headers without it are read); rows of an earlier schema are
converted to the current one when nothing is lost, refused otherwise."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
import structlog

from buffer import OffsetRange
from hakafka.consumer.schema import ColumnSpec, PipelineSchema
from hakafka.pipeline.walcodec import (
    SchemaChangeError,
    SchemaConverter,
    WalBatch,
    WalRecordError,
    decode,
    encode,
    fingerprint,
)
from wal import Position, WriteAheadLog


def batch(n: int, start: int = 0) -> pa.RecordBatch:
    return pa.record_batch(
        {
            "id": pa.array(range(start, start + n), pa.int64()),
            "_partition": pa.array([3] * n, pa.int32()),
            "_offset": pa.array(range(start, start + n), pa.int64()),
        }
    )


def test_round_trip_through_the_log(tmp_path: Path) -> None:
    dead = pa.record_batch({"_offset": pa.array([7], pa.int64()), "_error": ["bad json"]})
    written = [
        WalBatch("events", {("t", 3): OffsetRange(0, 9)}, batch(10)),
        WalBatch(
            "events",
            {("t", 3): OffsetRange(10, 20), ("t", 5): OffsetRange(4, 4)},
            batch(11, 10),
            dead,
        ),
    ]
    with WriteAheadLog.open(tmp_path, fsync="batch") as log:
        for item in written:
            log.append(*encode(item))
        log.sync()
    with WriteAheadLog.open(tmp_path, fsync="batch") as log:
        read = [decode(record) for record in log.replay()]
    assert [r.pipeline for r in read] == ["events", "events"]
    assert [dict(r.ranges) for r in read] == [dict(w.ranges) for w in written]
    assert read[0].rows.equals(written[0].rows)
    assert read[0].dead_letters is None
    assert read[1].rows.equals(written[1].rows)
    assert read[1].dead_letters is not None and read[1].dead_letters.equals(dead)


def test_foreign_record_is_named_by_position(tmp_path: Path) -> None:
    with WriteAheadLog.open(tmp_path, fsync="off") as log:
        position = log.append(b"not json", b"payload")
        record = next(iter(log.replay()))
    with pytest.raises(WalRecordError, match=f"WAL record at {position}: header is not JSON"):
        decode(record)


def test_header_carries_the_rows_schema_fingerprint(tmp_path: Path) -> None:
    with WriteAheadLog.open(tmp_path, fsync="off") as log:
        log.append(*encode(WalBatch("events", {("t", 3): OffsetRange(0, 4)}, batch(5))))
        (record,) = log.replay()
    header = json.loads(record.header)
    assert header["v"] == 2
    assert header["schema"] == fingerprint(batch(1).schema)
    assert decode(record).fingerprint == header["schema"]


def test_format_1_record_without_fingerprint_is_read(tmp_path: Path) -> None:
    # As a WAL written before fingerprints holds it: the fingerprint comes from the payload.
    header, payload = encode(WalBatch("events", {("t", 3): OffsetRange(0, 4)}, batch(5)))
    old = json.loads(header)
    del old["schema"]
    old["v"] = 1
    with WriteAheadLog.open(tmp_path, fsync="off") as log:
        log.append(json.dumps(old).encode(), payload)
        (record,) = log.replay()
    read = decode(record)
    assert read.rows.equals(batch(5))
    assert read.fingerprint == fingerprint(batch(5).schema)


def test_unknown_header_format_is_named_by_position(tmp_path: Path) -> None:
    header, payload = encode(WalBatch("events", {("t", 3): OffsetRange(0, 0)}, batch(1)))
    newer = json.loads(header) | {"v": 3}
    with WriteAheadLog.open(tmp_path, fsync="off") as log:
        position = log.append(json.dumps(newer).encode(), payload)
        (record,) = log.replay()
    with pytest.raises(WalRecordError, match=f"WAL record at {position}: unknown header format"):
        decode(record)


def test_fingerprint_covers_names_types_nullability_and_order() -> None:
    base = pa.schema([pa.field("a", pa.int64(), nullable=False), pa.field("b", pa.string())])
    same = pa.schema(list(base), metadata={b"k": b"v"})
    others = [
        pa.schema([pa.field("a", pa.int32(), nullable=False), base.field("b")]),
        pa.schema([pa.field("a", pa.int64()), base.field("b")]),
        pa.schema([base.field("b"), base.field("a")]),
        pa.schema([pa.field("c", pa.int64(), nullable=False), base.field("b")]),
    ]
    assert fingerprint(same) == fingerprint(base)
    assert len({fingerprint(s) for s in [base, *others]}) == 5


# -- conversion of rows written under an earlier schema ------------------------------------

OLD = PipelineSchema.of([("user", "String"), ("amount", "Int64")])
AT = Position(2, 4096)


def old_rows(n: int = 3) -> WalBatch:
    rows = pa.RecordBatch.from_pylist(
        [{"user": f"u{i}", "amount": i, "_partition": 0, "_offset": i} for i in range(n)],
        schema=OLD.arrow_schema(),
    )
    return WalBatch("events", {("t", 0): OffsetRange(0, n - 1)}, rows)


def converted(schema: PipelineSchema, item: WalBatch | None = None) -> pa.RecordBatch:
    out = SchemaConverter("events", schema).conform(item or old_rows(), AT)
    assert out.rows.schema.equals(schema.arrow_schema())
    assert out.fingerprint == fingerprint(schema.arrow_schema())
    return out.rows


def test_rows_of_the_current_schema_pass_as_they_are() -> None:
    item = old_rows()
    assert SchemaConverter("events", OLD).conform(item, AT) is item


def test_columns_added_not_required_are_null_dropped_ones_go_order_follows() -> None:
    schema = PipelineSchema(
        (
            ColumnSpec("note", "Nullable(String)"),
            ColumnSpec("amount", "Int64"),
            ColumnSpec("score", "Int32", required=False),  # ClickHouse stores its default
        ),
        ("_key",),
    )
    rows = converted(schema)
    assert rows.to_pydict() == {
        "note": [None] * 3,
        "amount": [0, 1, 2],
        "score": [None] * 3,
        "_partition": [0, 0, 0],
        "_offset": [0, 1, 2],
        "_key": [None] * 3,
    }


def test_a_column_made_nullable_or_no_longer_required_keeps_its_values() -> None:
    nullable = PipelineSchema.of([("user", "Nullable(String)"), ("amount", "Int64")])
    assert converted(nullable).column("user").to_pylist() == ["u0", "u1", "u2"]
    written = SchemaConverter("events", nullable).conform(old_rows(), AT)
    optional = PipelineSchema(
        (ColumnSpec("user", "String", required=False), ColumnSpec("amount", "Int64"))
    )
    assert converted(optional, written).column("user").to_pylist() == ["u0", "u1", "u2"]


@pytest.mark.parametrize(
    ("schema", "named"),
    [
        (
            PipelineSchema.of([("user", "String"), ("amount", "Int32")]),
            "column 'amount' is int64 in the WAL and int32 now (Int32)",
        ),
        (
            PipelineSchema.of([("user", "String"), ("amount", "Int64"), ("n", "UInt8")]),
            "column 'n' is absent from the WAL and required now (UInt8)",
        ),
        (
            PipelineSchema.of([("user", "String"), ("amount", "Int64")], ("_timestamp",)),
            "column '_timestamp' is absent from the WAL and required now (DateTime64(3))",
        ),
    ],
)
def test_a_change_that_would_lose_or_misread_rows_is_refused(
    schema: PipelineSchema, named: str
) -> None:
    with pytest.raises(SchemaChangeError) as caught:
        SchemaConverter("events", schema).conform(old_rows(), AT)
    message = str(caught.value)
    assert message.startswith("pipeline 'events': WAL record at 2:4096 holds rows")
    assert named in message
    assert "revert the column change" in message
    assert "hakafka wal inspect --pipeline events" in message


def test_nullable_made_required_is_refused_as_its_rows_may_hold_nulls() -> None:
    nullable = PipelineSchema.of([("user", "Nullable(String)"), ("amount", "Int64")])
    written = SchemaConverter("events", nullable).conform(old_rows(), AT)
    with pytest.raises(SchemaChangeError, match="'user' is string, nullable in the WAL and"):
        SchemaConverter("events", OLD).conform(written, AT)


def test_each_earlier_schema_is_compared_once() -> None:
    schema = PipelineSchema.of([("user", "String"), ("amount", "Int64"), ("x", "Nullable(Int8)")])
    converter = SchemaConverter("events", schema)
    with structlog.testing.capture_logs() as logs:
        for n in (1, 2, 3):
            assert converter.conform(old_rows(n), AT).rows.num_rows == n
    assert [e["event"] for e in logs] == ["wal.schema_converted"]
    assert logs[0]["added"] == ["x"] and logs[0]["dropped"] == []
