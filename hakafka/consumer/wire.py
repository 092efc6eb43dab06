"""The shared engine of the formats whose records name their writer schema (Avro, Protobuf).

A batch is split by writer schema (the Confluent header's schema id, or the one schema of a
schema file); each writer is resolved once per term and checked against the pipeline's
columns once (`Writer.problem`: a field a column cannot take, a required column the schema
lacks), then each group decodes in bulk (`Writer.read`). A group that fails is bisected by
the engine every format shares (`batch.BatchDecoder`), so one bad record costs a few bulk
reads, and rows go back into Kafka order before the meta columns are added. Fields map to
columns by name.

Which writer kinds a column's Arrow type takes (`fits`): Avro's promotions (int -> long ->
float -> double; string <-> bytes), any integer into any integer column (a value out of its
range makes that record bad), a union with null (or a Protobuf field with presence) into a
Nullable column or a required one (a null then makes the record bad), dates and timestamps
into Date/DateTime columns, decimals into Decimal, arrays into Array of a kind that fits,
records into Tuple, maps into Map, arrays of records into Nested.

Columns whose values the JSON engine converts and checks (UUID, IPv4/IPv6, Enum names,
FixedString, JSON, at any depth: `ArrowType.converted`) are built in their text form and go
through the same `convert_column` (`plan_column`), so a value ClickHouse would refuse is a
dead letter here too, never a block that cannot be inserted.
"""

from __future__ import annotations

import threading
from abc import abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import pyarrow as pa

from hakafka.consumer.batch import BatchDecoder, CountError, DecodedBatch
from hakafka.consumer.convert import convert_column
from hakafka.consumer.errors import SchemaError
from hakafka.consumer.messages import MessageColumns
from hakafka.consumer.options import DecodeOptions
from hakafka.consumer.registry import RegistryUnavailableError
from hakafka.consumer.schema import ArrowType, Check, ColumnSpec, PipelineSchema
from hakafka.consumer.shown import bare_type, shown


class Writer(Protocol):
    """One writer schema, resolved and checked against the pipeline's columns."""

    @property
    def problem(self) -> str | None:
        """Why no record of this schema fits the columns (None: they may)."""
        ...

    @property
    def converted(self) -> frozenset[str]:
        """The columns `read` builds in their text form, for `convert_column` to finish."""
        ...

    def read(self, bodies: list[bytes]) -> pa.Table:
        """The records in `bodies` (headers removed) as a table of the declared columns (in
        the types `plan_column` chose), one row per body; ValueError (or an Arrow error) if
        any body is not one fitting record."""
        ...


@dataclass(frozen=True)
class WriterGroup:
    """The messages of one writer schema: their positions in the batch and their bodies."""

    writer: Writer
    positions: list[int]
    bodies: list[bytes]


class WriterDecoder(BatchDecoder):
    """Decodes batches group by group of writer schema; see the module docstring."""

    def __init__(self, schema: PipelineSchema, options: DecodeOptions | None = None) -> None:
        super().__init__(schema, options)
        for column in schema.columns:
            if column.path:
                raise SchemaError(
                    f"column {column.name!r}: a path ({column.path!r}) is read from JSON "
                    "messages only; Avro and Protobuf fields map to columns by name"
                )
        # The group `_parse` reads, per thread: the flush lane's Kafka re-fetch decodes with
        # the same decoder while the consume lane does.
        self._local = threading.local()

    @abstractmethod
    def _groups(self, values: list[bytes]) -> tuple[list[WriterGroup], dict[int, str]]:
        """`values` grouped by writer schema, and the bad ones (position -> reason: no
        header, unknown schema id). Raises `RegistryUnavailableError` before deciding
        anything when the registry cannot answer."""

    def decode_columns(self, columns: MessageColumns) -> DecodedBatch:
        bad: dict[int, str] = {}
        idx, values = self._prefilter(columns.values, bad)
        groups, problems = self._groups(values) if values else ([], {})
        for pos, reason in problems.items():
            bad[idx[pos]] = reason
        tables: list[pa.Table] = []
        order: list[int] = []
        for group in groups:
            group_idx = [idx[p] for p in group.positions]
            if group.writer.problem is not None:
                bad.update(dict.fromkeys(group_idx, group.writer.problem))
                continue
            self._local.writer = group.writer
            parsed, spans = self._bisect(group.bodies, group_idx, b"", bad)
            tables += parsed
            order += [group_idx[p] for lo, hi in spans for p in range(lo, hi)]
        table = self._assemble(tables)
        good_idx = np.asarray(order, np.int64)
        if len(groups) > 1:  # groups interleave in Kafka order: put the rows back in it
            by_offset = np.argsort(good_idx, kind="stable")
            table, good_idx = table.take(pa.array(by_offset)), good_idx[by_offset]
        table, good_idx = self._check_required(table, good_idx, bad)
        return self._outcome(self._with_meta(table, good_idx, columns), columns, bad)

    def _reading(self) -> Writer:
        """The writer of the group this thread decodes."""
        writer: Writer = self._local.writer
        return writer

    def _parse_chunk(self, joined: bytes, values: list[bytes]) -> pa.Table:
        table = self._parse(joined, values)
        if table.num_rows != len(values):
            raise CountError(f"{table.num_rows} records from {len(values)} messages")
        converted = self._reading().converted
        for i, name, mapped in self._converts:
            if name in converted:
                table = table.set_column(i, name, convert_column(table.column(i), mapped, name))
        return pa.Table.from_arrays(table.columns, schema=self._declared)

    def _parse(self, joined: bytes, values: list[bytes]) -> pa.Table:
        del joined
        try:
            return self._reading().read(values)
        except (pa.ArrowException, ValueError, RegistryUnavailableError):
            raise
        except Exception as exc:  # decoders raise EOFError, IndexError, ... on bad bytes
            raise ValueError(f"{type(exc).__name__}: {exc}") from None


def fits(kind: str, target: pa.DataType) -> bool:
    """Whether a writer field of `kind` (bool, int, float, string, enum, bytes, date,
    timestamp, decimal, record, map, `array:<kind>`) may go into a column of Arrow type
    `target`."""
    if kind.startswith("array:"):
        return pa.types.is_list(target) and fits(kind.removeprefix("array:"), target.value_type)
    checks = {
        "bool": (pa.types.is_boolean,),
        "int": (pa.types.is_integer, pa.types.is_floating, pa.types.is_decimal),
        "float": (pa.types.is_floating,),
        "string": (pa.types.is_string, pa.types.is_binary),
        "enum": (pa.types.is_string, pa.types.is_integer),  # Protobuf: by name or number
        "bytes": (pa.types.is_binary, pa.types.is_string),
        "date": (pa.types.is_date,),
        "timestamp": (pa.types.is_timestamp,),
        "decimal": (pa.types.is_decimal,),
        "record": (pa.types.is_struct,),
        "map": (pa.types.is_map,),
    }
    return any(check(target) for check in checks.get(kind, ()))


@dataclass(frozen=True)
class ColumnPlan:
    """How a writer builds one column: in `build`, then `convert`ed as the JSON engine does."""

    build: pa.DataType
    convert: bool


def plan_column(kind: str, mapped: ArrowType) -> ColumnPlan | None:
    """The plan for a writer field of `kind` into a column of type `mapped`; None if it does
    not fit. Dates come as dates (no text form); bytes into FixedString stay bytes."""
    if kind == "date" and pa.types.is_date(mapped.arrow):
        return ColumnPlan(mapped.arrow, False)
    build = pa.binary() if kind == "bytes" and mapped.check is Check.FIXED_STRING else mapped.text
    return ColumnPlan(build, mapped.converted) if fits(kind, build) else None


def mismatch(where: str, field: str, kind: str, column: str, ch_type: str) -> str:
    """The reason a writer schema does not fit: a field a column cannot take."""
    return (
        f"{where}: field {field!r} ({kind.replace('array:', 'array of ')}) does not fit "
        f"column {column!r} {ch_type}"
    )


def misfit(column: ColumnSpec, value: object) -> str:
    """The reason a record is bad: its `value` of `column` does not convert to the column's
    type (a number out of the type's range, a decimal with too many digits)."""
    ch_type = bare_type(column.clickhouse_type)
    return f"column {column.name!r}: cannot convert {shown(value)} to {ch_type}"


def missing(where: str, column: str) -> str:
    """The reason a writer schema does not fit: it lacks a required column."""
    return f"{where} has no field {column!r} for required column {column!r}"


def null_columns(schema: pa.Schema, present: Sequence[str], rows: int) -> dict[str, pa.Array]:
    """All-null arrays of the declared columns a writer schema lacks (not required ones)."""
    return {f.name: pa.nulls(rows, f.type) for f in schema if f.name not in present}


def table_of(declared: pa.Schema, arrays: dict[str, pa.Array], rows: int) -> pa.Table:
    """The declared columns in order: `arrays` (in their plan types), nulls for the rest."""
    arrays = {**null_columns(declared, list(arrays), rows), **arrays}
    return pa.table([arrays[name] for name in declared.names], names=declared.names)
