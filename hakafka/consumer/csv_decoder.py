"""`format = "csv"`: one CSV record per message, read by Arrow's CSV reader in one call per
batch (see `CsvDecoder`)."""

from __future__ import annotations

import re

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv

from hakafka.consumer.batch import BLOCK_SIZE, BatchDecoder, refuse_paths
from hakafka.consumer.convert import convert_array
from hakafka.consumer.errors import SchemaError
from hakafka.consumer.options import DecodeOptions
from hakafka.consumer.schema import PipelineSchema, Shape
from hakafka.consumer.shown import bare_type, json_shown

_NEWLINE, _QUOTE, _CR = ord("\n"), ord('"'), ord("\r")
_LINE_BREAKS = re.compile(rb"[\r\n]*+")


class CsvDecoder(BatchDecoder):
    """One CSV record per message, fields in declared-column order, no header.

    Quoted fields may hold newlines. An empty unquoted field of a non-String column is null.
    A message is exactly one record (line breaks around it are ignored), else a bad message:
    two records, or a quote left open (which Arrow would read on into the next messages).
    A field that does not convert names its column and 1-based position (`column 'id' (CSV
    field 1): cannot convert "x" to UInt32`).
    """

    def __init__(self, schema: PipelineSchema, options: DecodeOptions | None = None) -> None:
        super().__init__(schema, options)
        refuse_paths(schema, "csv")
        for column in schema.columns:
            if column.mapped.shape is not Shape.SCALAR:
                raise SchemaError(
                    f"column {column.name!r}: {column.clickhouse_type} cannot be read from CSV"
                )
        self._read = pcsv.ReadOptions(
            column_names=self._text.names,
            use_threads=self.options.use_threads,
            block_size=BLOCK_SIZE,
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
        """Arrow's read of the CSV records `data`, converted per `convert`."""
        return pcsv.read_csv(
            pa.BufferReader(data),
            read_options=self._read,
            parse_options=self._parse_options,
            convert_options=convert,
        )

    def _misfit(self, value: bytes) -> str | None:
        """The first field of the record `value` that its column's type does not take (Arrow's
        conversion of that field alone, then `convert_column`'s checks); None if `value` is not one
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
                    convert_array(field.combine_chunks(), mapped)
            except ValueError:  # ArrowInvalid, _BadValueError
                found = json_shown(fields.column(position - 1)[0].as_py())
                return (
                    f"column {column.name!r} (CSV field {position}): cannot convert {found} to "
                    f"{bare_type(column.clickhouse_type)}"
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
