"""Decoders: a batch of Kafka messages -> one Arrow RecordBatch with the pipeline's schema.

The fast path parses the whole batch in one Arrow call (values joined with newlines). Only
when that fails does the decoder bisect the batch to isolate the bad messages, so one bad
message among 10k costs about two extra parses of the batch, not 10k small ones.

Bad messages (invalid UTF-8, oversized, empty or only whitespace, not exactly one record,
unparsable, type mismatch, a required field absent or null) never stop a partition:
`on_error="dead_letter"` returns them as dead-letter rows, `"skip"` logs and counts them,
`"fail"` raises `DecodeError` naming the first offset. Good rows keep Kafka order.

Each reason says what is wrong and where: once the bisection has a bad message alone, a
type error is traced to its column, where its value was read (a JSON Pointer, a CSV field's
position) and what was expected and found; that costs work only for bad messages.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv
import pyarrow.json as pjson
import structlog

from hakafka.consumer.dead_letter import dead_letter_batch
from hakafka.consumer.errors import DecodeError, SchemaError
from hakafka.consumer.messages import KafkaMessage, MessageColumns
from hakafka.consumer.registry import RegistrySettings, SchemaRegistry
from hakafka.consumer.schema import ArrowType, Check, ColumnSpec, PipelineSchema, Shape
from spark_bridge.chtypes import split_type, tuple_element


class Format(StrEnum):
    """How a message's value is encoded (a pipeline's `format`)."""

    JSON = "json"
    RAW = "raw"
    CSV = "csv"
    AVRO = "avro"
    PROTOBUF = "protobuf"


class OnError(StrEnum):
    """What happens to a bad message (a pipeline's `on_error`)."""

    DEAD_LETTER = "dead_letter"
    SKIP = "skip"
    FAIL = "fail"


DEFAULT_MAX_MESSAGE_BYTES = 1 << 20
DEFAULT_DEAD_LETTER_BYTES = 64 << 10
_LOG_SAMPLE = 5
# Arrow parses in blocks; 4 MiB measured fastest for ~200-byte JSON records.
_BLOCK_SIZE = 4 << 20
_ROW_HINT = re.compile(r" in row (\d+)$")
_NEWLINE, _BRACE, _QUOTE, _CR = ord("\n"), ord("{"), ord('"'), ord("\r")
_LINE_BREAKS = re.compile(rb"[\r\n]*+")

log = structlog.get_logger("hakafka.consumer.decode")


@dataclass(frozen=True)
class DecodedBatch:
    """The outcome of decoding one batch of messages.

    `rows` has `schema.arrow_schema()`: declared columns, then meta columns (always
    `_partition` and `_offset`, which go to ClickHouse too). `dead_letters` has
    `dead_letter_arrow_schema()` and is None unless `on_error="dead_letter"` found bad
    messages. `ranges` holds the first and last offset per (topic, partition) of ALL input
    messages, good and bad, so a checkpoint moves past bad messages as well; `counts` how many
    messages each holds (fewer than its offsets: the broker passed some over).
    """

    rows: pa.RecordBatch
    dead_letters: pa.RecordBatch | None
    ranges: dict[tuple[str, int], tuple[int, int]]
    good: int
    bad: int
    counts: dict[tuple[str, int], int] = field(default_factory=dict)


class Decoder(Protocol):
    """Turns message batches into `DecodedBatch`es of one pipeline schema."""

    @property
    def schema(self) -> PipelineSchema: ...

    def decode(self, messages: Sequence[KafkaMessage]) -> DecodedBatch:
        """Decode data messages (no error events), in Kafka order."""
        ...

    def decode_columns(self, columns: MessageColumns) -> DecodedBatch:
        """Decode messages already extracted into columns."""
        ...


@dataclass(frozen=True)
class DecodeOptions:
    """Per-pipeline decoding settings.

    `max_message_bytes`: a bigger value is a bad message. `dead_letter_bytes`: a dead
    letter keeps this much of its key and value. `use_threads`: let Arrow parse on several
    cores (off by default: the daemon runs one decoder per pipeline).
    """

    on_error: OnError = OnError.DEAD_LETTER
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    dead_letter_bytes: int = DEFAULT_DEAD_LETTER_BYTES
    use_threads: bool = False
    csv_delimiter: str = ","

    def __post_init__(self) -> None:
        try:  # an untyped caller may pass the plain string
            object.__setattr__(self, "on_error", OnError(self.on_error))
        except ValueError:
            raise ValueError(
                f"on_error must be dead_letter, skip or fail, got {self.on_error!r}"
            ) from None
        if self.max_message_bytes < 1:
            raise ValueError(f"max_message_bytes must be >= 1, got {self.max_message_bytes}")
        if self.dead_letter_bytes < 0:
            raise ValueError(f"dead_letter_bytes must be >= 0, got {self.dead_letter_bytes}")
        delimiter = self.csv_delimiter
        if len(delimiter) != 1 or not delimiter.isascii() or delimiter in '"\r\n':
            raise ValueError(
                "csv_delimiter must be one ASCII character other than a quote or a line "
                f"break, got {delimiter!r}"
            )


class _ChunkError(ValueError):
    """A chunk of messages does not parse into exactly one row per message."""


class _CountError(_ChunkError):
    """A chunk parses into more or fewer rows than it has messages."""


class _ArrowDecoder(ABC):
    """Shared engine: pre-checks, one-shot parse, bisection, required fields, assembly."""

    def __init__(self, schema: PipelineSchema, options: DecodeOptions | None = None) -> None:
        self._schema = schema
        self.options = options or DecodeOptions()
        self._declared = schema.declared_schema()
        self._text = schema.text_schema()
        self._mapped = [(column, column.mapped) for column in schema.columns]
        # Columns a text parser cannot produce directly, or whose values must pass a check:
        # parsed as `text`, then converted.
        self._converts = [
            (i, column.name, mapped)
            for i, (column, mapped) in enumerate(self._mapped)
            if mapped.converted
        ]
        self._output = schema.arrow_schema()
        self._required = [c.name for c in schema.columns if c.is_required]

    @property
    def schema(self) -> PipelineSchema:
        return self._schema

    # -- format specific -------------------------------------------------------------

    @abstractmethod
    def _parse(self, joined: bytes, values: list[bytes]) -> pa.Table:
        """Parse newline-joined `values` into a table of `self._text` (any row count)."""

    def _prepare(
        self, idx: list[int], values: list[bytes], joined: bytes, bad: dict[int, str]
    ) -> tuple[list[int], list[bytes], bytes]:
        """Hook for formats whose parser must not see some values (moved to `bad`) or must see
        them rewritten (never in place). Returns the kept indexes, values and their join."""
        del bad
        return idx, values, joined

    # -- engine ----------------------------------------------------------------------

    def decode(self, messages: Sequence[KafkaMessage]) -> DecodedBatch:
        return self.decode_columns(MessageColumns.from_messages(messages))

    def decode_columns(self, columns: MessageColumns) -> DecodedBatch:
        bad: dict[int, str] = {}
        idx, values = self._prefilter(columns.values, bad)
        joined = b"\n".join(values)
        if self._has_invalid_utf8(joined):
            idx, values, joined = _screen(idx, values, bad, _utf8_problem)
        if values:
            idx, values, joined = self._prepare(idx, values, joined, bad)
        tables, good_spans = self._bisect(values, idx, joined, bad) if values else ([], [])
        parsed = self._assemble(tables)
        good_pos = (
            np.concatenate([np.arange(lo, hi) for lo, hi in good_spans])
            if good_spans
            else np.empty(0, dtype=np.int64)
        )
        good_idx = (np.arange(len(columns)) if len(idx) == len(columns) else np.asarray(idx))[
            good_pos
        ]
        parsed, good_idx = self._check_required(parsed, good_idx, bad)
        rows = self._with_meta(parsed, good_idx, columns)
        return self._outcome(rows, columns, bad)

    def _prefilter(
        self, values: list[bytes | None], bad: dict[int, str]
    ) -> tuple[list[int], list[bytes]]:
        """Drop null/empty and oversized values (the common case: one pass, no per-row work)."""
        limit = self.options.max_message_bytes
        try:
            sizes = np.fromiter(map(len, values), np.int64, len(values))  # type: ignore[arg-type]
        except TypeError:  # a null value
            sizes = None
        if sizes is not None and (not sizes.size or 0 < sizes.min() <= sizes.max() <= limit):
            return list(range(len(values))), values  # type: ignore[return-value]
        idx: list[int] = []
        kept: list[bytes] = []
        for i, value in enumerate(values):
            if not value:
                bad[i] = "empty message (null or zero-length value)"
            elif len(value) > limit:
                bad[i] = f"message of {len(value)} bytes exceeds max_message_bytes {limit}"
            else:
                idx.append(i)
                kept.append(value)
        return idx, kept

    @staticmethod
    def _has_invalid_utf8(joined: bytes) -> bool:
        if joined.isascii():  # no allocation, the common case
            return False
        try:
            joined.decode("utf-8")
        except UnicodeDecodeError:
            return True
        return False

    def _parse_chunk(self, joined: bytes, values: list[bytes]) -> pa.Table:
        """Parse and cast; raise unless the chunk yields exactly one row per message."""
        table = self._parse(joined, values)
        if table.num_rows != len(values):
            if len(values) == 1:
                raise _CountError(f"message holds {table.num_rows} records, expected exactly one")
            raise _CountError(f"{table.num_rows} records from {len(values)} messages")
        for i, name, mapped in self._converts:
            table = table.set_column(i, name, _convert(table.column(i), mapped, name))
        return table

    def _bisect(
        self, values: list[bytes], idx: list[int], joined: bytes, bad: dict[int, str]
    ) -> tuple[list[pa.Table], list[tuple[int, int]]]:
        """Parse `values`, splitting failing chunks until single bad messages remain.

        A failing chunk is split around the row Arrow's error names, else in halves; any
        split is correct (only a message that fails alone is bad), the hint only saves parses.

        Returns the parsed tables and their [lo, hi) spans of `values`, in order; records the
        bad messages in `bad` (by message index, via `idx`).
        """
        tables: list[pa.Table] = []
        spans: list[tuple[int, int]] = []
        stack = [(0, len(values))]  # LIFO, left half pushed last: chunks come out in order
        while stack:
            lo, hi = stack.pop()
            chunk = values[lo:hi]
            try:
                whole = hi - lo == len(values)
                table = self._parse_chunk(joined if whole else b"\n".join(chunk), chunk)
            except (pa.ArrowException, ValueError) as exc:  # ArrowInvalid is a ValueError
                if hi - lo == 1:
                    bad[idx[lo]] = self._reason(values[lo], exc)
                else:
                    stack += _split(lo, hi, _row_hint(exc))
                continue
            tables.append(table)
            spans.append((lo, hi))
        return tables, spans

    def _reason(self, value: bytes, exc: BaseException) -> str:
        """Why `value`, parsed alone, failed with `exc`: the column and value `_misfit` finds
        at fault, else the error's own text (a wrong record count is never a misfit)."""
        found = None if isinstance(exc, _CountError) else self._misfit(value)
        return _error_text(exc) if found is None else found

    def _misfit(self, value: bytes) -> str | None:
        """Hook for formats that can tell which column of the single message `value` (a bad
        one) does not take its value, and why; None when they cannot."""
        del value
        return None

    def _assemble(self, tables: list[pa.Table]) -> pa.Table:
        declared = pa.schema([pa.field(f.name, f.type) for f in self._declared])
        if not tables:
            return declared.empty_table()
        table = tables[0] if len(tables) == 1 else pa.concat_tables(tables)
        return table.select(declared.names)

    def _check_required(
        self, table: pa.Table, good_idx: np.ndarray, bad: dict[int, str]
    ) -> tuple[pa.Table, np.ndarray]:
        """Move rows whose required fields are absent or null to `bad`."""
        missing: dict[int, list[str]] = {}
        for name in self._required:
            column = table.column(name)
            if column.null_count == 0:
                continue
            for row in np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False)):
                missing.setdefault(int(row), []).append(name)
        if not missing:
            return table, good_idx
        for pos, names in missing.items():
            fields = ", ".join(repr(n) for n in names)
            bad[int(good_idx[pos])] = f"required field {fields} is missing or null"
        keep = np.ones(table.num_rows, dtype=bool)
        keep[list(missing)] = False
        return table.filter(pa.array(keep)), good_idx[keep]

    def _with_meta(
        self, table: pa.Table, good_idx: np.ndarray, columns: MessageColumns
    ) -> pa.RecordBatch:
        everything = len(good_idx) == len(columns)
        take = None if everything else pa.array(good_idx, pa.int64())
        meta: dict[str, pa.Array] = {}
        for name in self._schema.meta_names:
            array = _meta_array(name, columns)
            meta[name] = array if take is None else array.take(take)
        arrays = [table.column(n).combine_chunks() for n in self._declared.names]
        arrays += [meta[n] for n in self._schema.meta_names]
        return pa.RecordBatch.from_arrays(arrays, schema=self._output)

    def _outcome(
        self, rows: pa.RecordBatch, columns: MessageColumns, bad: dict[int, str]
    ) -> DecodedBatch:
        dead: pa.RecordBatch | None = None
        if bad:
            first = min(bad)
            if self.options.on_error is OnError.FAIL:
                raise DecodeError(
                    columns.topics[first],
                    columns.partitions[first],
                    columns.offsets[first],
                    bad[first],
                )
            sample = [
                {
                    "topic": columns.topics[i],
                    "partition": columns.partitions[i],
                    "offset": columns.offsets[i],
                    "error": bad[i],
                }
                for i in sorted(bad)[:_LOG_SAMPLE]
            ]
            if self.options.on_error is OnError.DEAD_LETTER:
                dead = dead_letter_batch(columns, bad, self.options.dead_letter_bytes)
                log.warning("decode.dead_lettered", count=len(bad), sample=sample)
            else:
                log.warning("decode.skipped", count=len(bad), sample=sample)
        return DecodedBatch(
            rows=rows,
            dead_letters=dead,
            ranges=columns.ranges(),
            counts=columns.counts(),
            good=rows.num_rows,
            bad=len(bad),
        )


class _BadValueError(ValueError):
    """Value `index` of an array fails its column type; `position` locates it in the row."""

    def __init__(self, index: int, reason: str, position: str = "") -> None:
        super().__init__(reason)
        self.index = index
        self.reason = reason
        self.position = position


_UUID = r"^[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}$"
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_IPV4 = rf"^{_OCTET}\.{_OCTET}\.{_OCTET}\.{_OCTET}$"
_SHOWN = 64  # characters of a bad value quoted in its error
_ONE_THREAD = pjson.ReadOptions(use_threads=False)


def _convert(column: pa.ChunkedArray, mapped: ArrowType, name: str) -> pa.ChunkedArray:
    """A parsed column (`mapped.text`) as its final type (`mapped.arrow`), every value
    checked; a bad one raises `_ChunkError` naming the column, the value's position in it
    and the row (for the bisection)."""
    chunks = []
    start = 0
    for chunk in column.chunks:
        try:
            chunks.append(_convert_array(chunk, mapped))
        except _BadValueError as bad:
            raise _ChunkError(
                f"column {name!r}{bad.position}: {bad.reason} in row {start + bad.index}"
            ) from None
        start += len(chunk)
    return pa.chunked_array(chunks, mapped.arrow)


def _convert_array(array: pa.Array, mapped: ArrowType) -> pa.Array:
    if not mapped.converted:
        return array
    mask = array.is_null() if array.null_count else None
    if mapped.shape is Shape.SCALAR:
        return _convert_scalar(array, mapped)
    if mapped.shape is Shape.STRUCT:
        fields = list(mapped.arrow)
        children = []
        for child, field_type, arrow_field in zip(
            array.flatten(), mapped.children, fields, strict=True
        ):
            try:
                children.append(_convert_array(child, field_type))
            except _BadValueError as bad:
                raise _BadValueError(
                    bad.index, bad.reason, f".{arrow_field.name}{bad.position}"
                ) from None
        return pa.StructArray.from_arrays(children, fields=fields, mask=mask)
    offsets = array.offsets.to_numpy()
    first, last = int(offsets[0]), int(offsets[-1])
    relative = pa.array(offsets - first, pa.int32())

    def inner(values: pa.Array, item: ArrowType, what: str) -> pa.Array:
        try:
            return _convert_array(values.slice(first, last - first), item)
        except _BadValueError as bad:
            row = int(np.searchsorted(offsets - first, bad.index, side="right")) - 1
            local = bad.index - int(offsets[row] - first)
            raise _BadValueError(row, bad.reason, f"[{local}]{what}{bad.position}") from None

    if mapped.shape is Shape.LIST:
        values = inner(array.values, mapped.children[0], "")
        return pa.ListArray.from_arrays(relative, values, type=mapped.arrow, mask=mask)
    keys = inner(array.keys, mapped.children[0], ".key")
    items = inner(array.items, mapped.children[1], ".value")
    return pa.MapArray.from_arrays(relative, keys, items, type=mapped.arrow, mask=mask)


def _first_bad(ok: pa.Array, values: pa.Array, what: str) -> None:
    """Raise `_BadValueError` for the first value whose `ok` is false (null: fine)."""
    if pc.all(pc.fill_null(ok, True), min_count=0).as_py():
        return
    index = int(pc.index(pc.fill_null(ok, True), False).as_py())
    raise _BadValueError(index, f"{_shown(values[index].as_py())} is not {what}")


def _shown(value: object) -> str:
    """`value` as Python prints it, cut to `_SHOWN` characters."""
    return _clipped(repr(value))


def _json_shown(value: object) -> str:
    """`value` (a JSON value, or a CSV field) as JSON writes it, cut to `_SHOWN` characters."""
    return _clipped(json.dumps(value, ensure_ascii=False))


def _clipped(text: str) -> str:
    return text if len(text) <= _SHOWN else text[: _SHOWN - 3] + "..."


def _convert_scalar(array: pa.Array, mapped: ArrowType) -> pa.Array:
    check = mapped.check
    if check is Check.UUID:
        _first_bad(pc.match_substring_regex(array, _UUID), array, "a UUID")
        return pc.utf8_lower(array)
    if check is Check.IPV4:
        _first_bad(pc.match_substring_regex(array, _IPV4), array, "an IPv4 address")
        return array
    if check is Check.ENUM:
        known = pc.is_in(array, value_set=pa.array(sorted(mapped.enum_names), pa.string()))
        known = pc.or_kleene(known, pc.is_null(array))  # null: a Nullable column's no value
        names = ", ".join(repr(n) for n in sorted(mapped.enum_names))
        _first_bad(known, array, f"one of the Enum's names ({names})")
        return array
    if check is Check.FIXED_STRING:
        size = mapped.size
        lengths = pc.binary_length(array)
        _first_bad(pc.less_equal(lengths, size), array, f"at most {size} bytes long")
        return _padded(array, size)
    if check is Check.IPV6:
        return _per_value(array, _ipv6_text, "an IPv6 address")
    if check is Check.JSON:
        return _per_value(array, _json_object_text, "a JSON object")
    cast = array.cast(mapped.arrow)
    if pa.types.is_date(mapped.arrow):
        same = pc.equal(cast.cast(array.type), array)
        if not pc.all(pc.fill_null(same, True), min_count=0).as_py():
            index = int(pc.index(pc.fill_null(same, True), False).as_py())
            raise _BadValueError(index, f"a Date value has a time of day ({mapped.arrow} expected)")
    return cast


def _padded(array: pa.Array, size: int) -> pa.Array:
    """Strings of at most `size` bytes as fixed_size_binary(size), zero-padded at the end
    (as ClickHouse stores a shorter FixedString value)."""
    start = array.offset
    offsets = np.frombuffer(array.buffers()[1], np.int32)[start : start + len(array) + 1]
    offsets = offsets.astype(np.int64)
    lengths = np.diff(offsets)
    data = np.frombuffer(array.buffers()[2] or b"", np.uint8)
    out = np.zeros(len(array) * size, np.uint8)
    rows = np.repeat(np.arange(len(array)), lengths)
    within = np.arange(int(lengths.sum())) - np.repeat(offsets[:-1] - offsets[0], lengths)
    out[rows * size + within] = data[offsets[0] : offsets[-1]]
    fixed = pa.FixedSizeBinaryArray.from_buffers(
        pa.binary(size), len(array), [None, pa.py_buffer(out)]
    )
    if not array.null_count:
        return fixed
    return pc.if_else(array.is_null(), pa.scalar(None, pa.binary(size)), fixed)


def _per_value(array: pa.Array, text_of: Callable[[str], str | None], what: str) -> pa.Array:
    """Values no Arrow kernel checks: each distinct one through `text_of` (its canonical
    text, or None if it is not `what`)."""
    texts: list[str | None] = []
    known: dict[str, str | None] = {}
    for index, value in enumerate(array.to_pylist()):
        if value is None:
            texts.append(None)
            continue
        if value not in known:
            known[value] = text_of(value)
        if known[value] is None:
            raise _BadValueError(index, f"{_shown(value)} is not {what}")
        texts.append(known[value])
    return pa.array(texts, pa.string())


def _ipv6_text(value: str) -> str | None:
    """An IPv6 (or IPv4, as its mapped IPv6) address as ClickHouse prints it."""
    try:
        address = ipaddress.ip_address(value)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv4Address):
        return f"::ffff:{address}"
    if address.scope_id is not None:
        return None
    if address.ipv4_mapped is not None:
        return f"::ffff:{address.ipv4_mapped}"
    packed = address.packed
    # IPv4-compatible (96 zero bits, then a word that is not zero): the tail as a quad.
    if not any(packed[:12]) and any(packed[12:14]):
        return f"::{ipaddress.IPv4Address(packed[12:])}"
    return str(address)


def _json_object_text(value: str) -> str | None:
    try:
        parsed = json.loads(value)
    except ValueError:
        return None
    return value if isinstance(parsed, dict) else None


def _row_hint(exc: BaseException) -> int | None:
    """The chunk row an Arrow JSON error names ("... in row 17"), if any."""
    found = _ROW_HINT.search(str(exc))
    return int(found.group(1)) if found else None


def _split(lo: int, hi: int, row: int | None) -> list[tuple[int, int]]:
    """Sub-chunks of failing [lo, hi) in stack order (last popped first)."""
    if row is not None and 0 <= row < hi - lo:
        bad_at = lo + row
        parts = [(lo, bad_at), (bad_at, bad_at + 1), (bad_at + 1, hi)]
        return [(a, b) for a, b in reversed(parts) if b > a]
    mid = (lo + hi) // 2
    return [(mid, hi), (lo, mid)]


def _error_text(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    # Arrow's row number refers to the chunk that failed, not to the message: drop it.
    return _ROW_HINT.sub("", text)


def _meta_array(name: str, columns: MessageColumns) -> pa.Array:
    arrays = {
        "_topic": lambda: columns.topic_array,
        "_partition": lambda: columns.partition_array,
        "_offset": lambda: columns.offset_array,
        "_timestamp": lambda: columns.timestamp_array,
        "_key": lambda: columns.key_array,
    }
    if name not in arrays:
        raise SchemaError(f"unknown meta column {name!r}")
    return arrays[name]()


class JsonDecoder(_ArrowDecoder):
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
        _check_paths(schema.columns)
        self._objects = [c for c in schema.columns if c.mapped.needs_objects]
        parsed = [c for c in schema.columns if not c.mapped.needs_objects]
        # True: Arrow's parse is already the text table (no paths, no object columns).
        self._direct = not self._objects and all(c.steps == (c.name,) for c in parsed)
        self.read_options = pjson.ReadOptions(
            use_threads=self.options.use_threads, block_size=_BLOCK_SIZE
        )
        self.parse_options = pjson.ParseOptions(
            explicit_schema=self._text if self._direct else _parse_schema(parsed),
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
                    columns[column.name] = _at_path(table.column(column.steps[0]), column.steps)
        if self._objects:
            messages = [json.loads(value) for value in values]
            for column in self._objects:
                columns[column.name] = _object_column(messages, column)
        return pa.table([columns[name] for name in self._text.names], schema=self._text)

    def _misfit(self, value: bytes) -> str | None:
        """The first column (in declared order) whose value in `value` does not fit, named
        with the JSON Pointer to that value; or where `value` is not one JSON object; None if
        the `json` module reads it and finds nothing wrong (Arrow's error then stands)."""
        text = value.decode()  # valid UTF-8: `decode_columns` moved the others to `bad`
        try:
            message = json.loads(text)
        except json.JSONDecodeError as exc:
            return f"not valid JSON at byte {len(text[: exc.pos].encode())}: {exc.msg}"
        except RecursionError:  # nested deeper than Python's stack; Arrow's text says why
            return None
        if not isinstance(message, dict):
            return _Misfit((), "a JSON object", message).text()
        for column, mapped in self._mapped:
            if mapped.needs_objects:
                found = _value_misfit(
                    _follow(message, column.steps),
                    mapped,
                    _bare(column.clickhouse_type),
                    column.steps,
                    _object_scalar,
                    checks=True,
                )
            else:
                found = _parsed_misfit(message, column, mapped)
            if found is not None:
                return _json_reason(column, found)
        return None

    def _read(self, joined: bytes) -> pa.Table:
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
        return _screen(idx, values, bad, _json_problem, _one_line)


def _screen(
    idx: list[int],
    values: list[bytes],
    bad: dict[int, str],
    problem: Callable[[bytes], str | None],
    rewrite: Callable[[bytes], bytes] | None = None,
) -> tuple[list[int], list[bytes], bytes]:
    """Values in which `problem` finds nothing (rewritten if given), their indexes and their
    join; the others go to `bad` with the problem's text."""
    keep_idx: list[int] = []
    keep: list[bytes] = []
    for i, value in zip(idx, values, strict=True):
        found = problem(value)
        if found is not None:
            bad[i] = found
            continue
        keep_idx.append(i)
        keep.append(value if rewrite is None else rewrite(value))
    return keep_idx, keep, b"\n".join(keep)


def _utf8_problem(value: bytes) -> str | None:
    try:
        value.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"invalid UTF-8 at byte {exc.start}: {exc.reason}"
    return None


def _json_problem(value: bytes) -> str | None:
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


@dataclass
class _PathNode:
    """One place in the messages that columns read: a leaf (`column`) or a container of
    `keys` (an object) or of `item` (an array)."""

    column: ColumnSpec | None = None
    keys: dict[str, _PathNode] | None = None
    item: _PathNode | None = None

    def arrow_text(self) -> pa.DataType:
        if self.column is not None:
            return self.column.mapped.text
        if self.item is not None:
            return pa.list_(self.item.arrow_text())
        return pa.struct([(k, n.arrow_text()) for k, n in (self.keys or {}).items()])


def _path_tree(columns: Sequence[ColumnSpec]) -> _PathNode:
    """The paths of `columns` merged into one tree; SchemaError if two overlap (one reads
    inside the other's value, or both the same place)."""
    root = _PathNode(keys={})
    for column in columns:
        node = root
        for step in column.steps:
            if node.column is not None:
                _overlap(node.column, column)
            if isinstance(step, int):
                if node.keys:
                    _overlap(_a_column(node), column)
                node.item = node.item or _PathNode()
                node = node.item
            else:
                if node.item is not None:
                    _overlap(_a_column(node), column)
                node.keys = {} if node.keys is None else node.keys
                node = node.keys.setdefault(step, _PathNode())
        if node.column is not None or node.keys or node.item is not None:
            _overlap(_a_column(node), column)
        node.column = column
    return root


def _a_column(node: _PathNode) -> ColumnSpec:
    """A column at or below `node` (there is one: only columns make nodes)."""
    while node.column is None:
        node = node.item if node.item is not None else next(iter((node.keys or {}).values()))
    return node.column


def _overlap(first: ColumnSpec, second: ColumnSpec) -> None:
    raise SchemaError(
        f"columns {first.name!r} (path {_path_text(first)}) and {second.name!r} (path "
        f"{_path_text(second)}) overlap: a column may not read the same value as another, "
        "or a value inside another's"
    )


def _path_text(column: ColumnSpec) -> str:
    return column.path or column.name


def _check_paths(columns: Sequence[ColumnSpec]) -> None:
    _path_tree(columns)


def _parse_schema(columns: Sequence[ColumnSpec]) -> pa.Schema:
    """The explicit schema Arrow's JSON reader parses `columns` (at their paths) with."""
    tree = _path_tree(columns)
    return pa.schema([(k, n.arrow_text()) for k, n in (tree.keys or {}).items()])


def _at_path(column: pa.ChunkedArray, steps: tuple[str | int, ...]) -> pa.Array:
    """The values at `steps[1:]` inside the parsed top-level field `column` (null where a
    step is absent, null or past an array's end)."""
    array = column.combine_chunks() if len(steps) > 1 else column
    for step in steps[1:]:
        if isinstance(step, str):
            array = array.flatten()[array.type.get_field_index(step)]
        else:
            offsets = array.offsets.to_numpy()
            present = np.diff(offsets) > step
            if array.null_count:
                present &= array.is_valid().to_numpy(zero_copy_only=False)
            array = array.values.take(pa.array(offsets[:-1] + step, pa.int64(), mask=~present))
    return array


# What building a column's text values from Python values (`pa.array`) raises for a bad one.
_CONVERSION_ERRORS = (pa.ArrowException, ValueError, TypeError, OverflowError)
_Steps = tuple[str | int, ...]  # keys and indexes from a JSON message's root
_ReadScalar = Callable[[object, ArrowType], pa.Array]  # a scalar into its type's text form


def _object_column(messages: list[object], column: ColumnSpec) -> pa.Array:
    """`column` from messages parsed by `json`, in its text type."""
    mapped, steps = column.mapped, column.steps
    try:
        values = [_text_value(_follow(m, steps), mapped) for m in messages]
        return pa.array(values, mapped.text)
    except _CONVERSION_ERRORS as exc:
        raise _ChunkError(f"column {column.name!r}: {exc}") from None


def _follow(message: object, steps: _Steps) -> object:
    """The value at `steps` in `message` (parsed by `json`); None where a step finds no key,
    no such item, or not an object or array."""
    value = message
    for step in steps:
        if isinstance(step, str):
            value = value.get(step) if isinstance(value, dict) else None
        else:
            value = value[step] if isinstance(value, list) and step < len(value) else None
    return value


def _items(value: object, mapped: ArrowType) -> list[tuple[str | int, object, int]] | None:
    """The contents of `value` read as the container `mapped` (Array, Map, Tuple), as
    `_text_value` reads them: for each, its step (index or key), its value and the index of its
    type in `mapped.children` (of a Map entry: its value's). None if `value` is not the JSON
    container `mapped` is read from: an array (for an unnamed Tuple, of as many items as it
    has), else an object."""
    if mapped.shape is Shape.LIST or mapped.positional:
        if not isinstance(value, list):
            return None
        if mapped.shape is Shape.LIST:
            return [(i, item, 0) for i, item in enumerate(value)]
        return (
            [(i, item, i) for i, item in enumerate(value)]
            if len(value) == len(mapped.children)
            else None
        )
    if not isinstance(value, dict):
        return None
    if mapped.shape is Shape.MAP:
        return [(key, item, 1) for key, item in value.items()]
    return [(f.name, value.get(f.name), i) for i, f in enumerate(mapped.arrow)]


def _text_value(value: object, mapped: ArrowType) -> object:
    """A JSON value as the Python value Arrow builds `mapped.text` from; ValueError names a
    value of the wrong shape."""
    if value is None:
        return None
    if mapped.shape is Shape.LIST:
        if not isinstance(value, list):
            raise ValueError(f"{_shown(value)} is not an array")
        return [_text_value(v, mapped.children[0]) for v in value]
    if mapped.shape is Shape.MAP:
        if not isinstance(value, dict):
            raise ValueError(f"{_shown(value)} is not an object (Map)")
        key_type, value_type = mapped.children
        numeric = pa.types.is_integer(key_type.text)
        return [(int(k) if numeric else k, _text_value(v, value_type)) for k, v in value.items()]
    if mapped.shape is Shape.STRUCT:
        names = [f.name for f in mapped.arrow]
        if mapped.positional:
            if not isinstance(value, list) or len(value) != len(names):
                raise ValueError(f"{_shown(value)} is not an array of {len(names)} (Tuple)")
            items = value
        elif isinstance(value, dict):
            items = [value.get(n) for n in names]
        else:
            raise ValueError(f"{_shown(value)} is not an object (Tuple)")
        return {n: _text_value(v, t) for n, v, t in zip(names, items, mapped.children, strict=True)}
    if mapped.check is Check.JSON:
        if not isinstance(value, dict):
            raise ValueError(f"{_shown(value)} is not a JSON object")
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    if pa.types.is_timestamp(mapped.text) and isinstance(value, str):
        parsed = dt.datetime.fromisoformat(value)
        return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)
    return value


@dataclass(frozen=True)
class _Misfit:
    """A value its column does not take: `found`, at `at` (steps from the message's root),
    where `expected` (a ClickHouse type, or the container a path goes through) was. `convert`:
    `found` is a kind of value the type is read from, yet it does not convert."""

    at: _Steps
    expected: str
    found: object
    convert: bool = False

    def text(self, where: str = "") -> str:
        """What is wrong, `where` (" at /x", or nothing) after the value or the type."""
        shown = _json_shown(self.found)
        if self.convert:
            return f"cannot convert {shown}{where} to {self.expected}"
        return f"expected {self.expected}{where}, got {_json_kind(self.found)} {shown}"


def _json_kind(value: object) -> str:
    """The JSON kind of a value parsed by `json`, as Arrow's errors name it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _kinds_read(mapped: ArrowType) -> tuple[str, ...]:
    """The JSON kinds a scalar type is read from."""
    text = mapped.text
    if mapped.check is Check.JSON:
        return ("object",)
    if pa.types.is_boolean(text):
        return ("boolean",)
    if pa.types.is_string(text) or pa.types.is_timestamp(text):
        return ("string",)
    if pa.types.is_decimal(text):
        return ("number", "string")
    return ("number",)


def _pointer(steps: _Steps) -> str:
    """`steps` as a JSON Pointer (RFC 6901): `/user/id`, `/items/0/sku`."""
    return "".join("/" + str(s).replace("~", "~0").replace("/", "~1") for s in steps)


def _bare(ch_type: str) -> str:
    """`ch_type` without the Nullable and LowCardinality around it."""
    name, args = split_type(ch_type)
    return _bare(args[0]) if name in ("Nullable", "LowCardinality") else ch_type.strip()


def _inner_types(ch_type: str) -> list[str]:
    """The ClickHouse types of `arrow_type(ch_type).children`, in order, bare (`_bare`)."""
    name, args = split_type(_bare(ch_type))
    if name == "Nested":
        return [f"Tuple({', '.join(args)})"]
    if name == "Tuple":
        args = [tuple_element(arg)[1] for arg in args]
    return [_bare(arg) for arg in args]  # Array(T): [T]; Map(K, V): [K, V]


def _json_scalar(value: object, mapped: ArrowType) -> pa.Array:
    """`value` (parsed by `json`) as Arrow's JSON reader reads it into the scalar type
    `mapped.text`: a one-value array. ValueError (or an Arrow error) where the reader fails:
    a kind it does not read into the type, a fraction or an integer out of range for an
    integer type, text its timestamp or decimal parser refuses."""
    text = mapped.text
    kind = _json_kind(value)
    if kind not in _kinds_read(mapped) or (pa.types.is_integer(text) and isinstance(value, float)):
        raise ValueError(f"Arrow reads no JSON {kind} as {text}")
    if pa.types.is_timestamp(text) or pa.types.is_decimal(text):  # Arrow's own text parsers
        document = pa.BufferReader(b'{"v":' + json.dumps(value).encode() + b"}")
        options = pjson.ParseOptions(explicit_schema=pa.schema([("v", text)]))
        read = pjson.read_json(document, read_options=_ONE_THREAD, parse_options=options)
        return read.column(0).combine_chunks()
    if pa.types.is_floating(text) and isinstance(value, int):
        value = float(value)  # as Arrow reads an integer too big for int64: the nearest double
    return pa.array([value], text)


def _object_scalar(value: object, mapped: ArrowType) -> pa.Array:
    """`value` (parsed by `json`) as `_object_column` builds it into the scalar type
    `mapped.text`: a one-value array; an error where that fails."""
    return pa.array([_text_value(value, mapped)], mapped.text)


def _object_key(key: object, mapped: ArrowType) -> pa.Array:
    """An object's key as `_text_value` builds it into the Map key type `mapped` (an integer
    type: by `int`): a one-value array; an error where that fails."""
    return pa.array([int(str(key)) if pa.types.is_integer(mapped.text) else key], mapped.text)


def _parsed_misfit(
    message: dict[str, object], column: ColumnSpec, mapped: ArrowType
) -> _Misfit | None:
    """The first value in `message` that Arrow's JSON reader, reading `column` at its path
    (`_parse_schema`), or then `_convert`, refuses: a value on the path that is not the
    object or array the next step needs, or a value of the column's type that does not fit.
    Arrow reads every item of an array on the path; `_convert` checks only the value the
    path picks (`_at_path`)."""
    spots: list[tuple[_Steps, object]] = [((), message)]
    for step in column.steps:
        inner: list[tuple[_Steps, object]] = []
        for at, value in spots:
            if value is None:
                continue
            if isinstance(step, str):
                if not isinstance(value, dict):
                    return _Misfit(at, "an object", value)
                inner.append(((*at, step), value.get(step)))
            elif isinstance(value, list):
                inner += [((*at, i), item) for i, item in enumerate(value)]
            else:
                return _Misfit(at, "an array", value)
        spots = inner
    ch_type = _bare(column.clickhouse_type)
    for at, value in spots:
        found = _value_misfit(value, mapped, ch_type, at, _json_scalar, checks=at == column.steps)
        if found is not None:
            return found
    return None


def _value_misfit(
    value: object, mapped: ArrowType, ch_type: str, at: _Steps, read: _ReadScalar, *, checks: bool
) -> _Misfit | None:
    """The first value in `value` (at `at`, of ClickHouse type `ch_type`) that does not fit:
    a container that is not the one `mapped` is read from, a scalar `read` fails on, or, if
    `checks`, one `_convert` refuses."""
    if value is None:
        return None
    if mapped.shape is Shape.SCALAR:
        return _scalar_misfit(value, mapped, ch_type, at, read, checks=checks)
    items = _items(value, mapped)
    if items is None:
        return _Misfit(at, ch_type, value)
    inner = _inner_types(ch_type)
    for step, item, i in items:
        here = (*at, step)
        found = None
        if mapped.shape is Shape.MAP:
            key_ch = f"{inner[0]} (a Map key)"
            found = _scalar_misfit(
                step, mapped.children[0], key_ch, here, _object_key, checks=checks
            )
        found = found or _value_misfit(
            item, mapped.children[i], inner[i], here, read, checks=checks
        )
        if found is not None:
            return found
    return None


def _scalar_misfit(
    value: object, mapped: ArrowType, ch_type: str, at: _Steps, read: _ReadScalar, *, checks: bool
) -> _Misfit | None:
    """A misfit if `read` fails on the scalar `value` or, if `checks`, `_convert` refuses it."""
    try:
        array = read(value, mapped)
    except _CONVERSION_ERRORS:
        return _Misfit(at, ch_type, value, convert=_json_kind(value) in _kinds_read(mapped))
    if checks and mapped.converted:
        try:
            _convert_array(array, mapped)
        except ValueError:  # _BadValueError, or an Arrow cast error
            return _Misfit(at, ch_type, value)
    return None


def _json_reason(column: ColumnSpec, misfit: _Misfit) -> str:
    """A dead letter's reason for `misfit` in `column`: the column, and the JSON Pointer to the
    value when it lies in the column's value, else to the column's value with " at" where
    the path went wrong."""
    steps = column.steps
    inside = misfit.at[: len(steps)] == steps
    where = "" if inside else f" at {_pointer(misfit.at)}"
    pointer = _pointer(misfit.at if inside else steps)
    return f"column {column.name!r} (JSON {pointer}): {misfit.text(where)}"


class RawDecoder(_ArrowDecoder):
    """The whole value as the single declared column, which must be a String type."""

    def __init__(self, schema: PipelineSchema, options: DecodeOptions | None = None) -> None:
        super().__init__(schema, options)
        _refuse_paths(schema, "raw")
        if len(schema.columns) != 1 or not pa.types.is_string(schema.columns[0].mapped.arrow):
            raise SchemaError(
                "format 'raw' needs exactly one declared column of type String, got "
                + ", ".join(f"{c.name} {c.clickhouse_type}" for c in schema.columns)
            )

    def _parse(self, joined: bytes, values: list[bytes]) -> pa.Table:
        del joined
        # UTF-8 was validated before: the cast only relabels the buffers.
        column = pa.array(values, pa.binary()).cast(pa.string())
        return pa.table({self._declared.names[0]: column})


class CsvDecoder(_ArrowDecoder):
    """One CSV record per message, fields in declared-column order, no header.

    Quoted fields may hold newlines. An empty unquoted field of a non-String column is null.
    A message is exactly one record (line breaks around it are ignored), else a bad message:
    two records, or a quote left open (which Arrow would read on into the next messages).
    A field that does not convert names its column and 1-based position (`column 'id' (CSV
    field 1): cannot convert "x" to UInt32`).
    """

    def __init__(self, schema: PipelineSchema, options: DecodeOptions | None = None) -> None:
        super().__init__(schema, options)
        _refuse_paths(schema, "csv")
        for column in schema.columns:
            if column.mapped.shape is not Shape.SCALAR:
                raise SchemaError(
                    f"column {column.name!r}: {column.clickhouse_type} cannot be read from CSV"
                )
        self._read = pcsv.ReadOptions(
            column_names=self._text.names,
            use_threads=self.options.use_threads,
            block_size=_BLOCK_SIZE,
        )
        self._parse_options = pcsv.ParseOptions(
            delimiter=self.options.csv_delimiter, newlines_in_values=True
        )
        self._convert = _csv_convert({f.name: f.type for f in self._text})
        self._fields = _csv_convert(dict.fromkeys(self._text.names, pa.string()))
        self._record, self._one_record = _csv_record_patterns(self.options.csv_delimiter)

    def _prepare(
        self, idx: list[int], values: list[bytes], joined: bytes, bad: dict[int, str]
    ) -> tuple[list[int], list[bytes], bytes]:
        """Keep only messages that are exactly one record each, so that each message's row
        comes from its own bytes: a quote left open would swallow the next messages, and
        an empty line (no row) or two records would shift later rows onto wrong offsets.

        Only messages holding a quote or a line break can be anything but one record: a
        batch without any costs three byte scans; otherwise numpy picks the messages that
        need the exact (regex) check.
        """
        if b'"' not in joined and b"\r" not in joined and joined.count(b"\n") == len(values) - 1:
            return idx, values, joined
        problems = {
            int(pos): found
            for pos in _csv_suspects(values, joined, ord(self.options.csv_delimiter))
            if (found := self._record_problem(values[pos])) is not None
        }
        if not problems:
            return idx, values, joined
        for pos, found in problems.items():
            bad[idx[pos]] = found
        keep = [pos for pos in range(len(values)) if pos not in problems]
        values = [values[pos] for pos in keep]
        return [idx[pos] for pos in keep], values, b"\n".join(values)

    def _record_problem(self, value: bytes) -> str | None:
        """None if `value` is one CSV record as Arrow reads it, else what it is instead."""
        if self._one_record.fullmatch(value):
            return None
        records, pos, end = 0, 0, len(value)
        while True:  # both patterns match the empty string
            pos = _LINE_BREAKS.match(value, pos).end()  # type: ignore[union-attr]
            if pos == end:
                break
            records += 1
            pos = self._record.match(value, pos).end()  # type: ignore[union-attr]
            # A record ends at a line break, or where a field's opening quote never closes.
            if pos < end and value[pos] not in b"\r\n":
                return f"unclosed quote opened at byte {pos}, expected one CSV record"
        if not records:
            return "message holds only line breaks, expected a CSV record"
        return f"message holds {records} records, expected exactly one"

    def _parse(self, joined: bytes, values: list[bytes]) -> pa.Table:
        del values
        return self._read_csv(joined, self._convert)

    def _read_csv(self, data: bytes, convert: pcsv.ConvertOptions) -> pa.Table:
        return pcsv.read_csv(
            pa.BufferReader(data),
            read_options=self._read,
            parse_options=self._parse_options,
            convert_options=convert,
        )

    def _misfit(self, value: bytes) -> str | None:
        """The first field of the record `value` that its column's type does not take (Arrow's
        conversion of that field alone, then `_convert`'s checks); None if `value` is not one
        record of as many fields as there are columns (Arrow's error says so)."""
        try:
            fields = self._read_csv(value, self._fields)
        except pa.ArrowInvalid:
            return None
        if fields.num_rows != 1:
            return None
        for position, (column, mapped) in enumerate(self._mapped, start=1):
            field = fields.column(position - 1)
            try:
                if not pa.types.is_string(mapped.text):
                    only = _csv_convert({column.name: mapped.text}, [column.name])
                    field = self._read_csv(value, only).column(0)
                if mapped.converted:
                    _convert_array(field.combine_chunks(), mapped)
            except ValueError:  # ArrowInvalid, _BadValueError
                found = _json_shown(fields.column(position - 1)[0].as_py())
                return (
                    f"column {column.name!r} (CSV field {position}): cannot convert {found} to "
                    f"{_bare(column.clickhouse_type)}"
                )
        return None


def _csv_convert(
    types: dict[str, pa.DataType], only: list[str] | None = None
) -> pcsv.ConvertOptions:
    """Arrow's CSV conversion of the columns `types` names into those types (of the columns
    `only`, if given). NULL is what ClickHouse's CSV reads as NULL (an empty field, \\N), not
    Arrow's pandas-style list, which turned "nan" and "NA" into NULL silently."""
    return pcsv.ConvertOptions(
        column_types=types,
        include_columns=only,
        null_values=["", "\\N"],
        quoted_strings_can_be_null=False,
    )


def _refuse_paths(schema: PipelineSchema, format: str) -> None:
    for column in schema.columns:
        if column.path:
            raise SchemaError(
                f"column {column.name!r}: a path ({column.path}) is only read from format "
                f"'json', not {format!r}"
            )


def _csv_record_patterns(delimiter: str) -> tuple[re.Pattern[bytes], re.Pattern[bytes]]:
    """Arrow's CSV grammar (quote `"`, doubled to escape, no escape character): one record
    (it matches anywhere, stopping at a line break or at a quote that never closes), and a
    whole message of exactly one non-empty record between optional line breaks."""
    sep = re.escape(delimiter.encode())
    # Up to the delimiter or a line break, a quote is plain text unless it opens the field;
    # a quoted field closes at a quote not doubled, and what follows it is plain text.
    text = rb"[^%s\r\n]*+" % sep
    field = rb'(?:"(?:[^"]++|"")*+"%s|[^"%s\r\n]%s)?+' % (text, sep, text)
    record = rb"%s(?:%s%s)*+" % (field, sep, field)
    return re.compile(record), re.compile(rb"[\r\n]*+(?=[^\r\n])%s[\r\n]*+" % record)


def _csv_suspects(values: list[bytes], joined: bytes, delimiter: int) -> np.ndarray:
    """Positions in `values` (joined with newlines in `joined`) of the messages that may not
    be exactly one CSV record; every other one surely is.

    Sure: no line break, and quotes only in RFC 4180 form, which Arrow reads as one record
    closed at the message's end: an even number of quotes, each opening one (1st, 3rd, ...)
    after a delimiter, the message start or a quote, each closing one before a delimiter,
    the message end or a quote (`""` inside a quoted field is one closing and one opening).
    """
    data = np.frombuffer(b"\n" + joined + b"\n", np.uint8)  # every message between newlines
    ends = np.cumsum(np.fromiter(map(len, values), np.int64, len(values)) + 1)
    suspect = np.zeros(len(values), dtype=bool)
    newlines = data == _NEWLINE
    newlines[0] = newlines[ends] = False  # those around the messages
    breaks = np.flatnonzero(newlines | (data == _CR))
    suspect[np.searchsorted(ends, breaks)] = True
    quotes = np.flatnonzero(data == _QUOTE)
    owner = np.searchsorted(ends, quotes)
    counts = np.bincount(owner, minlength=len(values))
    nth = np.arange(len(quotes)) - (np.cumsum(counts) - counts)[owner]  # within its message
    beside = data[quotes - 1 + 2 * (nth & 1)]  # before an opening, after a closing
    loose = (beside != delimiter) & (beside != _NEWLINE) & (beside != _QUOTE)
    suspect[owner[loose]] = True
    suspect[counts % 2 == 1] = True
    return np.flatnonzero(suspect)


def make_decoder(
    format: Format,
    schema: PipelineSchema,
    options: DecodeOptions | None = None,
    *,
    registry: RegistrySettings | None = None,
    schema_file: Path | None = None,
) -> Decoder:
    """The decoder for pipeline `format`. `avro` reads the Confluent wire format through
    `registry`, or plain records of the schema in `schema_file`; `protobuf` needs `registry`."""
    decoders: dict[Format, type[_ArrowDecoder]] = {
        Format.JSON: JsonDecoder,
        Format.RAW: RawDecoder,
        Format.CSV: CsvDecoder,
    }
    try:  # an untyped caller may pass the plain string
        kind = Format(format)
    except ValueError:
        allowed = ", ".join(f.value for f in Format)
        raise SchemaError(f"unknown format {format!r}; use one of {allowed}") from None
    # Imported here: fastavro and protobuf load only for the pipelines that use them.
    if kind is Format.AVRO:
        from hakafka.consumer.avro import AvroDecoder

        return AvroDecoder(
            schema,
            options,
            registry=None if registry is None else SchemaRegistry(registry),
            schema_file=schema_file,
        )
    if kind is Format.PROTOBUF:
        from hakafka.consumer.protobuf import ProtobufDecoder

        if registry is None:
            raise SchemaError("format 'protobuf' needs a schema registry ([schema_registry])")
        return ProtobufDecoder(schema, options, registry=SchemaRegistry(registry))
    return decoders[kind](schema, options)
