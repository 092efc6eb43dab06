"""Encoding of query results as JSON, CSV or Arrow IPC, and choosing one from a request."""

from __future__ import annotations

import base64
import datetime
import decimal
import io
import json
from enum import Enum

import pyarrow as pa
import pyarrow.csv as pacsv


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


def encode(table: pa.Table, fmt: Format) -> bytes:
    """``table`` in ``fmt``. JSON is ``{"columns": [{name, type}], "rows": [{col: value}]}``
    with binary as base64, temporal values as ISO 8601 and decimals as strings."""
    if fmt is Format.JSON:
        doc = {
            "columns": [{"name": f.name, "type": str(f.type)} for f in table.schema],
            "rows": table.to_pylist(),
        }
        return json.dumps(doc, default=_json_value).encode()
    sink = io.BytesIO()
    if fmt is Format.CSV:
        pacsv.write_csv(table, sink)
    else:
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
    return sink.getvalue()


def decode_arrow(data: bytes) -> pa.Table:
    """The table in an Arrow IPC stream."""
    return pa.ipc.open_stream(data).read_all()
