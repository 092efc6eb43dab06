"""`format = "avro"`: Avro records in the Confluent wire format (writer schema by id from the
registry), or plain Avro records of the one writer schema in `schema_file`.

Bulk decoding: the bodies of one writer schema are joined and read one record after the
other with fastavro's `schemaless_reader` (in C), each required to end exactly where its
message does, so a truncated record or one with bytes left over fails the batch and
bisection isolates it (a single record must end exactly at its message's end: "cut short",
"bytes left"). The records then become Arrow arrays in one `pa.array` call per batch,
straight into the columns' types; `bench/formats_bench.py` has the decoder against fastavro
alone. The bodies were once read as ONE block of an in-memory object container
(`block_reader`), which checks only where the block ends: a record cut short stole the next
record's first bytes, the records after it were read out of step, and in most batches the
misreading ended exactly at the block's end, so the cut record and its neighbours went to
ClickHouse with wrong values (a Kafka batch with a truncated record in its middle).
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fastavro
import pyarrow as pa

from hakafka.consumer.convert import CONVERSION_ERRORS
from hakafka.consumer.errors import SchemaError
from hakafka.consumer.options import DecodeOptions
from hakafka.consumer.registry import (
    HEADER_BYTES,
    SchemaRegistry,
    group_by_id,
    unknown_id,
    wire_headers,
)
from hakafka.consumer.schema import ColumnSpec, PipelineSchema
from hakafka.consumer.wire import (
    ColumnPlan,
    WriterDecoder,
    WriterGroup,
    misfit,
    mismatch,
    missing,
    plan_column,
    table_of,
)

_PRIMITIVE_KINDS = {
    "boolean": "bool",
    "int": "int",
    "long": "int",
    "float": "float",
    "double": "float",
    "string": "string",
    "bytes": "bytes",
}
_LOGICAL_KINDS = {
    "date": "date",
    "timestamp-millis": "timestamp",
    "timestamp-micros": "timestamp",
    "timestamp-nanos": "timestamp",
    "decimal": "decimal",
}


def _kind(avro_type: Any, named: dict[str, Any]) -> tuple[str, bool]:
    """(kind for `wire.fits`, whether it may be null) of a parsed Avro type."""
    if isinstance(avro_type, list):  # a union: null plus exactly one other branch
        branches = [t for t in avro_type if t != "null"]
        if len(branches) != 1:
            return f"union of {len(branches)} non-null types", True
        return _kind(branches[0], named)[0], len(branches) < len(avro_type)
    if isinstance(avro_type, str):
        if avro_type in _PRIMITIVE_KINDS:
            return _PRIMITIVE_KINDS[avro_type], False
        return _kind(named[avro_type], named) if avro_type in named else (avro_type, False)
    logical = avro_type.get("logicalType")
    if logical in _LOGICAL_KINDS:
        return _LOGICAL_KINDS[logical], False
    base = avro_type["type"]
    if base == "array":
        return "array:" + _kind(avro_type["items"], named)[0], False
    if base == "enum":
        return "string", False
    if base == "fixed":
        return "bytes", False
    if base in ("record", "map"):
        return base, False
    return _kind(base, named)


@dataclass
class AvroWriter:
    """One Avro writer schema, checked against the columns; reads bodies in bulk."""

    where: str  # "writer schema 7", "schema_file x.avsc": named in every reason
    parsed: dict[str, Any]
    columns: tuple[ColumnSpec, ...]
    declared: pa.Schema
    problem: str | None = None
    _plans: dict[str, ColumnPlan] = field(default_factory=dict)  # the columns the writer has

    def __post_init__(self) -> None:
        if self.problem is not None:
            return
        named: dict[str, Any] = {}
        _collect_named(self.parsed, named)
        by_name = {f["name"]: f["type"] for f in self.parsed.get("fields", ())}
        for column in self.columns:
            if column.name not in by_name:
                if column.is_required:
                    self.problem = self.problem or missing(self.where, column.name)
                continue
            kind = _kind(by_name[column.name], named)[0]
            plan = plan_column(kind, column.mapped)
            if plan is None:
                self.problem = self.problem or mismatch(
                    self.where, column.name, kind, column.name, column.clickhouse_type
                )
            else:
                self._plans[column.name] = plan

    @property
    def converted(self) -> frozenset[str]:
        return frozenset(name for name, plan in self._plans.items() if plan.convert)

    def read(self, bodies: list[bytes]) -> pa.Table:
        records = self._one(bodies[0]) if len(bodies) == 1 else self._block(bodies)
        fields = [pa.field(name, plan.build) for name, plan in self._plans.items()]
        try:
            struct = pa.array(records, pa.struct(fields))
        except CONVERSION_ERRORS:
            found = self._misfit(records[0]) if len(records) == 1 else None
            if found is None:
                raise
            raise ValueError(found) from None
        arrays = {name: struct.field(i) for i, name in enumerate(self._plans)}
        return table_of(self.declared, arrays, len(bodies))

    def _misfit(self, record: dict[str, Any]) -> str | None:
        """The reason (`wire.misfit`) of the first column whose value in `record` does not
        convert to the type its plan builds; None if each converts alone."""
        for column in self.columns:
            plan = self._plans.get(column.name)
            if plan is None:
                continue
            try:
                pa.array([record.get(column.name)], plan.build)
            except CONVERSION_ERRORS:
                return misfit(column, record.get(column.name))
        return None

    def _one(self, body: bytes) -> list[Any]:
        reader = io.BytesIO(body)
        try:
            record = fastavro.schemaless_reader(reader, self.parsed, None)
        except EOFError:
            raise ValueError(f"the Avro record is cut short ({self.where})") from None
        if reader.tell() != len(body):
            raise ValueError(
                f"{len(body) - reader.tell()} bytes left after the Avro record ({self.where})"
            )
        return [record]

    def _block(self, bodies: list[bytes]) -> list[Any]:
        """Each body's record, read in turn from the bodies joined; ValueError at the first
        that does not end where its message does (bisection then finds which)."""
        joined = io.BytesIO(b"".join(bodies))
        read, parsed, where = fastavro.schemaless_reader, self.parsed, joined.tell
        records: list[Any] = []
        end = 0
        for body in bodies:
            end += len(body)
            records.append(read(joined, parsed, None))  # EOFError... wrapped by the caller
            if where() != end:
                raise ValueError("the records do not end where the messages do")
        return records


def _collect_named(avro_type: Any, named: dict[str, Any]) -> None:
    """Named types (records, enums, fixed) of a parsed schema by full name."""
    if isinstance(avro_type, list):
        for branch in avro_type:
            _collect_named(branch, named)
    elif isinstance(avro_type, dict):
        if "name" in avro_type and avro_type.get("type") in ("record", "enum", "fixed"):
            named[avro_type["name"]] = avro_type
        for f in avro_type.get("fields", ()):
            _collect_named(f["type"], named)
        for key in ("items", "values"):
            if key in avro_type:
                _collect_named(avro_type[key], named)


def _uuid_as_string(avro_type: Any) -> Any:
    """The schema with logicalType uuid dropped: fastavro then reads such strings as `str`
    (not `uuid.UUID`), which the UUID column's check takes."""
    if isinstance(avro_type, list):
        return [_uuid_as_string(t) for t in avro_type]
    if isinstance(avro_type, dict):
        kept = {
            k: v
            for k, v in avro_type.items()
            if avro_type.get("logicalType") != "uuid" or k != "logicalType"
        }
        return {k: _uuid_as_string(v) for k, v in kept.items()}
    return avro_type


def parse_avro_schema(text: str, where: str) -> dict[str, Any]:
    """A writer schema parsed by fastavro; SchemaError naming `where` if it is not a valid
    Avro record schema."""
    try:
        parsed = fastavro.parse_schema(_uuid_as_string(json.loads(text)))
    except (ValueError, TypeError, KeyError, fastavro.schema.SchemaParseException) as exc:
        raise SchemaError(f"{where} is not a valid Avro schema: {exc}") from None
    if not isinstance(parsed, dict) or parsed.get("type") != "record":
        raise SchemaError(f"{where} must be an Avro record schema")
    return dict(parsed)


class AvroDecoder(WriterDecoder):
    """Confluent-framed Avro (writer schema by id from `registry`), or plain Avro records of
    the one schema in `schema_file` (no header)."""

    def __init__(
        self,
        schema: PipelineSchema,
        options: DecodeOptions | None = None,
        *,
        registry: SchemaRegistry | None = None,
        schema_file: Path | None = None,
    ) -> None:
        super().__init__(schema, options)
        if (registry is None) == (schema_file is None):
            raise SchemaError("format 'avro' needs either a schema registry or a schema_file")
        self._registry = registry
        self._writers: dict[int, AvroWriter | None] = {}  # schema id -> writer (None: unknown)
        self._file: AvroWriter | None = None
        if schema_file is not None:
            where = f"schema_file {schema_file}"
            try:
                text = schema_file.read_text()
            except OSError as exc:
                raise SchemaError(f"cannot read {where}: {exc.strerror}") from None
            self._file = self._checked(where, parse_avro_schema(text, where))

    def _groups(self, values: list[bytes]) -> tuple[list[WriterGroup], dict[int, str]]:
        if self._file is not None:
            return [WriterGroup(self._file, list(range(len(values))), values)], {}
        ids, problems = wire_headers(values)
        good = [p for p in range(len(values)) if p not in problems]
        groups = []
        for schema_id, positions in group_by_id(ids, good).items():
            writer = self._writer_of(schema_id)
            if writer is None:
                problems.update(dict.fromkeys(positions, unknown_id(schema_id)))
                continue
            bodies = [values[p][HEADER_BYTES:] for p in positions]
            groups.append(WriterGroup(writer, positions, bodies))
        return groups, problems

    def _writer_of(self, schema_id: int) -> AvroWriter | None:
        if schema_id in self._writers:
            return self._writers[schema_id]
        assert self._registry is not None
        found = self._registry.by_id(schema_id)  # RegistryUnavailableError: nothing cached
        writer: AvroWriter | None = None
        if found is not None:
            where = f"writer schema {schema_id}"
            try:
                if found.schema_type != "AVRO":
                    raise SchemaError(f"{where} is {found.schema_type}, not Avro")
                writer = self._checked(where, parse_avro_schema(found.text, where))
            except SchemaError as exc:  # no record of it can fit: each is a dead letter
                writer = AvroWriter(where, {}, (), self._declared, problem=str(exc))
        self._writers[schema_id] = writer
        return writer

    def _checked(self, where: str, parsed: dict[str, Any]) -> AvroWriter:
        return AvroWriter(where, parsed, self.schema.columns, self._declared)
