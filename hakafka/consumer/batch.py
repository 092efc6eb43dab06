"""What a decoder does with a batch of Kafka messages, for every format: one Arrow
RecordBatch with the pipeline's schema (`DecodedBatch`, the `Decoder` protocol), made by the
engine the formats share (`BatchDecoder`); a format supplies only its parse.

The fast path parses the whole batch in one Arrow call (values joined with newlines). Only
when that fails does the decoder bisect the batch to isolate the bad messages, so one bad
message among 10k costs about two extra parses of the batch, not 10k small ones.

Bad messages (invalid UTF-8, oversized, empty or only whitespace, not exactly one record,
unparsable, type mismatch, a required field absent or null) never stop a partition:
`on_error="dead_letter"` returns them as dead-letter rows, `"skip"` logs and counts them,
`"fail"` raises `DecodeError` naming the first offset. Good rows keep Kafka order.

Each reason says what is wrong and where: once the bisection has a bad message alone, a
format may trace a type error to its column, where its value was read (a JSON Pointer, a CSV
field's position) and what was expected and found (`_misfit`); that costs work only for bad
messages.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import pyarrow as pa
import structlog

from hakafka.consumer.convert import ChunkError, convert_column
from hakafka.consumer.dead_letter import dead_letter_batch
from hakafka.consumer.errors import DecodeError, SchemaError
from hakafka.consumer.messages import KafkaMessage, MessageColumns
from hakafka.consumer.options import DecodeOptions, OnError
from hakafka.consumer.schema import PipelineSchema

_LOG_SAMPLE = 5
# Arrow parses in blocks; 4 MiB measured fastest for ~200-byte JSON records.
BLOCK_SIZE = 4 << 20
_ROW_HINT = re.compile(r" in row (\d+)$")

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


class CountError(ChunkError):
    """A chunk parses into more or fewer rows than it has messages."""


class BatchDecoder(ABC):
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
        """The pipeline schema of every batch this decoder returns."""
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
        """`Decoder.decode`."""
        return self.decode_columns(MessageColumns.from_messages(messages))

    def decode_columns(self, columns: MessageColumns) -> DecodedBatch:
        """`Decoder.decode_columns`: pre-checks, the format's `_prepare`, the parse (bisected
        where it fails), required fields, meta columns, and the bad messages per `on_error`."""
        bad: dict[int, str] = {}
        idx, values = self._prefilter(columns.values, bad)
        joined = b"\n".join(values)
        if self._has_invalid_utf8(joined):
            idx, values, joined = screen(idx, values, bad, _utf8_problem)
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
        """Whether `joined` is not valid UTF-8."""
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
                raise CountError(f"message holds {table.num_rows} records, expected exactly one")
            raise CountError(f"{table.num_rows} records from {len(values)} messages")
        for i, name, mapped in self._converts:
            table = table.set_column(i, name, convert_column(table.column(i), mapped, name))
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
        found = None if isinstance(exc, CountError) else self._misfit(value)
        return _error_text(exc) if found is None else found

    def _misfit(self, value: bytes) -> str | None:
        """Hook for formats that can tell which column of the single message `value` (a bad
        one) does not take its value, and why; None when they cannot."""
        del value
        return None

    def _assemble(self, tables: list[pa.Table]) -> pa.Table:
        """The parsed `tables` as one table of the declared columns, in order (empty if none)."""
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
        """The rows of `table` with the meta columns of their messages (`good_idx` in
        `columns`) after the declared ones: the output schema."""
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
        """The `DecodedBatch` of `rows` and the `bad` messages (index -> reason) of `columns`,
        per `on_error`: dead letters, or a logged skip; `fail` raises `DecodeError` for the
        first."""
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


def screen(
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
    """Where `value` is not valid UTF-8, or None."""
    try:
        value.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"invalid UTF-8 at byte {exc.start}: {exc.reason}"
    return None


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
    """A bad message's reason from the error its parse alone raised."""
    text = str(exc).strip() or type(exc).__name__
    # Arrow's row number refers to the chunk that failed, not to the message: drop it.
    return _ROW_HINT.sub("", text)


def _meta_array(name: str, columns: MessageColumns) -> pa.Array:
    """The meta column `name` (`_topic`, `_offset`, ...) of every message in `columns`."""
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


def refuse_paths(schema: PipelineSchema, format: str) -> None:
    """SchemaError if a column of `schema` has a path: `format` reads none."""
    for column in schema.columns:
        if column.path:
            raise SchemaError(
                f"column {column.name!r}: a path ({column.path}) is only read from format "
                f"'json', not {format!r}"
            )
