"""Encoding of query results as JSON, CSV or Arrow IPC, and choosing one from a request."""

from __future__ import annotations

import base64
import datetime
import decimal
import json
import math
from enum import Enum

import pyarrow as pa
import pyarrow.csv as pacsv

from buffer.sql import QueryResult


class Format(Enum):
    """A result format and its media type."""

    JSON = "application/json"
    CSV = "text/csv"
    ARROW = "application/vnd.apache.arrow.stream"


_BY_NAME = {"json": Format.JSON, "csv": Format.CSV, "arrow": Format.ARROW}


def choose_format(name: str | None, accept: str | None) -> Format:
    """The format named by ``name`` (json, csv, arrow), else the first known Accept media type,
    else JSON. Raises ValueError for an unknown ``name``."""
    if name:
        try:
            return _BY_NAME[name.lower()]
        except KeyError:
            raise ValueError(f"unknown format {name!r}; use one of {sorted(_BY_NAME)}") from None
    for part in (accept or "").split(","):
        media = part.split(";")[0].strip().lower()
        for fmt in Format:
            if media == fmt.value:
                return fmt
    return Format.JSON


def _json_value(value: object) -> object:
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, datetime.date | datetime.time | datetime.datetime):
        return value.isoformat()
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, decimal.Decimal):
        return str(value)
    raise TypeError(f"cannot encode {type(value).__name__} as JSON")


def _has_floats(kind: pa.DataType) -> bool:
    return pa.types.is_floating(kind) or any(
        _has_floats(kind.field(i).type) for i in range(kind.num_fields)
    )


def _finite(value: object) -> object:
    """``value`` with every NaN and ±Inf inside it replaced by None (JSON has neither)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    return value


def _json_rows(batch: pa.RecordBatch) -> bytes:
    """The rows of ``batch`` as JSON objects, comma-separated, without brackets."""
    columns = [
        [_finite(v) for v in column.to_pylist()] if _has_floats(column.type) else column.to_pylist()
        for column in batch.columns
    ]
    names = batch.schema.names
    rows = [dict(zip(names, values, strict=True)) for values in zip(*columns, strict=True)]
    return json.dumps(rows, default=_json_value, allow_nan=False)[1:-1].encode()


def json_document(table: pa.Table) -> bytes:
    """``table``'s rows as one JSON array of objects, encoded as the servers' JSON answers
    are (ISO 8601 times, decimals as strings, NaN and ±Inf as null)."""
    parts = [_json_rows(batch) for batch in table.to_batches() if batch.num_rows]
    return b"[" + b",".join(parts) + b"]"


class _Chunks:
    """A write-only file collecting what an Arrow writer writes, as the answer's chunks."""

    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.unreported = 0

    @property
    def closed(self) -> bool:
        return False

    def write(self, data: bytes) -> int:
        self.chunks.append(bytes(data))
        self.unreported += len(data)
        return len(data)

    def flush(self) -> None:
        """Nothing is buffered."""

    def report(self, result: QueryResult) -> None:
        """Count what was written since the last report against ``result``'s limits."""
        result.encoded(self.unreported)
        self.unreported = 0


def encode(result: QueryResult, fmt: Format) -> list[bytes]:
    """The answer ``result`` in ``fmt``, as chunks to send in order, each counted against the
    result's limits as it is encoded (so a limit or the deadline stops encoding early).

    JSON is ``{"columns": [{name, type}], "rows": [{col: value}]}`` with binary as base64,
    temporal values as ISO 8601, decimals as strings and NaN and ±Inf as null (as
    ClickHouse's JSON formats write them by default).
    """
    out = _Chunks()
    if fmt is Format.JSON:
        columns = [{"name": f.name, "type": str(f.type)} for f in result.schema]
        out.write(b'{"columns": ' + json.dumps(columns).encode() + b', "rows": [')
        separator = b""
        for batch in result:
            if batch.num_rows:
                out.write(separator + _json_rows(batch))
                separator = b", "
                out.report(result)
        out.write(b"]}")
    else:
        writer = (
            pacsv.CSVWriter(out, result.schema)
            if fmt is Format.CSV
            else pa.ipc.new_stream(out, result.schema)
        )
        with writer:
            for batch in result:
                writer.write_batch(batch)
                out.report(result)
    out.report(result)
    return out.chunks


def encode_arrow(data: pa.Table | pa.RecordBatch) -> bytes:
    """`data` as an Arrow IPC stream (what `decode_arrow` reads)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, data.schema) as writer:
        writer.write(data)
    return bytes(sink.getvalue().to_pybytes())


def decode_arrow(data: bytes) -> pa.Table:
    """The table in an Arrow IPC stream."""
    return pa.ipc.open_stream(data).read_all()
