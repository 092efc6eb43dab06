"""`format = "json"`: one JSON object per message, read by Arrow's JSON reader in one call
per batch (see `JsonDecoder`)."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.json as pjson

from hakafka.consumer.batch import BLOCK_SIZE, BatchDecoder, screen
from hakafka.consumer.json_paths import at_path, check_paths, object_column, parse_schema
from hakafka.consumer.json_reasons import json_misfit
from hakafka.consumer.options import DecodeOptions
from hakafka.consumer.schema import PipelineSchema

_NEWLINE, _BRACE = ord("\n"), ord("{")


class JsonDecoder(BatchDecoder):
    """One JSON object per message; fields not in the schema are ignored.

    A column reads the top-level field of its name, or the value at its `path`. Arrow parses
    every column it can, nested paths included (as structs and lists, then taken apart);
    columns of a type Arrow's JSON reader cannot produce (Map, JSON, an unnamed Tuple, at any
    depth) are read from the messages parsed by the `json` module, only in pipelines that
    declare one.

    A value with a raw newline (legal only as whitespace between JSON tokens) is checked
    with the strict `json` module and its newlines turned into spaces before the batch parse.

    A bad message's reason names the column, the JSON Pointer of the value and what was
    expected and found (`column 'user_id' (JSON /user/id): expected UInt64, got string
    "x"`), or the byte where the message stops being JSON.
    """

    def __init__(self, schema: PipelineSchema, options: DecodeOptions | None = None) -> None:
        super().__init__(schema, options)
        check_paths(schema.columns)
        self._objects = [c for c in schema.columns if c.mapped.needs_objects]
        parsed = [c for c in schema.columns if not c.mapped.needs_objects]
        # True: Arrow's parse is already the text table (no paths, no object columns).
        self._direct = not self._objects and all(c.steps == (c.name,) for c in parsed)
        self.read_options = pjson.ReadOptions(
            use_threads=self.options.use_threads, block_size=BLOCK_SIZE
        )
        self.parse_options = pjson.ParseOptions(
            explicit_schema=self._text if self._direct else parse_schema(parsed),
            unexpected_field_behavior="ignore",
        )

    def _parse(self, joined: bytes, values: list[bytes]) -> pa.Table:
        if self._direct:
            return self._read(joined)
        columns: dict[str, pa.ChunkedArray | pa.Array] = {}
        if len(self.parse_options.explicit_schema):
            table = self._read(joined)
            if table.num_rows != len(values):
                return table  # `_parse_chunk` names the count
            for column in self._schema.columns:
                if not column.mapped.needs_objects:
                    columns[column.name] = at_path(table.column(column.steps[0]), column.steps)
        if self._objects:
            messages = [json.loads(value) for value in values]
            for column in self._objects:
                columns[column.name] = object_column(messages, column)
        return pa.table([columns[name] for name in self._text.names], schema=self._text)

    def _misfit(self, value: bytes) -> str | None:
        """`json_misfit`: the first column whose value in `value` does not fit, or where
        `value` is not one JSON object; None if the `json` module finds nothing wrong."""
        return json_misfit(value, self._mapped)

    def _read(self, joined: bytes) -> pa.Table:
        """Arrow's parse of the JSON lines `joined`, any row count."""
        return pjson.read_json(
            pa.BufferReader(joined),
            read_options=self.read_options,
            parse_options=self.parse_options,
        )

    def _prepare(
        self, idx: list[int], values: list[bytes], joined: bytes, bad: dict[int, str]
    ) -> tuple[list[int], list[bytes], bytes]:
        """Keep the parse to one row per message; the common case is one vectorised check.

        Arrow reads a line of whitespace as no row and `{..} {..}` as two, so a whitespace
        value next to a two-object one would shift every later row onto the wrong offset:
        whitespace-only values are bad here, and then rows == messages means one row each.
        A value starting with `null` is bad too: pyarrow 26's read_json crashes the process
        (SIGSEGV) when a chunk starts with one and reads a later one as a row of nulls.
        """
        if _one_object_per_line(joined, len(values)):
            return idx, values, joined
        return screen(idx, values, bad, _json_problem, _one_line)


def _json_problem(value: bytes) -> str | None:
    """Why Arrow must not parse `value` with the others (only whitespace, a leading
    `null`), or None."""
    text = value.strip(b" \t\r\n")
    if not text:
        return "message holds only whitespace, expected a JSON object"
    if text.startswith(b"null"):
        return "JSON value is null, expected an object"
    return None


def _one_line(value: bytes) -> bytes:
    """A JSON value with its raw newlines (whitespace between tokens) turned into spaces; an
    invalid value is left as it is, for the parse to reject with Arrow's error text."""
    if b"\n" not in value and b"\r" not in value:
        return value
    try:
        json.loads(value)
    except ValueError:
        return value
    return value.replace(b"\r", b" ").replace(b"\n", b" ")


def _one_object_per_line(joined: bytes, count: int) -> bool:
    """True if `joined` is `count` lines, each starting with `{`, and has no carriage return."""
    data = np.frombuffer(joined, np.uint8)
    newlines = np.flatnonzero(data == _NEWLINE)
    return (
        len(newlines) == count - 1
        and data[0] == _BRACE
        and (not len(newlines) or newlines[-1] + 1 < len(data))
        and bool((data[newlines + 1] == _BRACE).all())
        and b"\r" not in joined
    )
