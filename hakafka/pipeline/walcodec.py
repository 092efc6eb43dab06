"""How a pipeline's consumed batch is stored in the WAL, and read back on replay.

One WAL record per consumed batch. The header is small JSON: the pipeline name, the exact
offset range per (topic, partition) of every message in the batch (good and bad), the row
counts, the length of the first IPC stream and the rows schema's fingerprint. The payload is
the decoded rows as an Arrow IPC stream, followed by the dead-letter rows as a second IPC
stream when there are any.

Header formats: 2 adds `schema` (the fingerprint) to 1; both are read, a format-1 record's
fingerprint is computed from its payload.

Records outlive a change of the pipeline's columns (a restart with a new config finds the
old leader's WAL): `SchemaConverter` turns rows written under an earlier schema into the
current one when no row can be lost or misread, and refuses the change otherwise.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NoReturn

import pyarrow as pa
import structlog

from buffer import OffsetRange
from hakafka.consumer.schema import PipelineSchema
from wal import Position, Record

FORMAT_VERSION = 2
_READABLE_VERSIONS = (1, FORMAT_VERSION)

log = structlog.get_logger("hakafka.pipeline.walcodec")

Ranges = Mapping[tuple[str, int], OffsetRange]


class WalRecordError(ValueError):
    """A WAL record passed its CRC but is not a record this codec wrote (names its position)."""


class SchemaChangeError(Exception):
    """WAL rows the pipeline still needs were written under columns it cannot convert from
    (names the pipeline, the record, the column, both types and the migration steps)."""


@dataclass(frozen=True)
class WalBatch:
    """One consumed batch: its rows, its dead letters and the offsets it covers.

    `fingerprint` is that of the rows schema as a decoded record stored it; encoding
    computes it from `rows`."""

    pipeline: str
    ranges: Ranges
    rows: pa.RecordBatch
    dead_letters: pa.RecordBatch | None = None
    fingerprint: str | None = None


def fingerprint(schema: pa.Schema) -> str:
    """16 hex digits of SHA-256 over the schema's column names, types and nullability, in
    order: equal for equal schemas in any process (metadata ignored)."""
    text = "\n".join(f"{f.name}\t{f.type}\t{f.nullable}" for f in schema)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _ipc(batch: pa.RecordBatch) -> pa.Buffer:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue()


def encode(batch: WalBatch) -> tuple[bytes, bytes | pa.Buffer]:
    """The (header, payload) to append for `batch`."""
    rows = _ipc(batch.rows)
    dead = _ipc(batch.dead_letters) if batch.dead_letters is not None else None
    header = {
        "v": FORMAT_VERSION,
        "pipeline": batch.pipeline,
        "ranges": [[t, p, r.first, r.last] for (t, p), r in sorted(batch.ranges.items())],
        "rows": batch.rows.num_rows,
        "dead": batch.dead_letters.num_rows if batch.dead_letters is not None else 0,
        "rows_ipc": rows.size,
        "schema": fingerprint(batch.rows.schema),
    }
    encoded = json.dumps(header, separators=(",", ":")).encode()
    if dead is None:
        return encoded, rows
    return encoded, rows.to_pybytes() + dead.to_pybytes()


def decode_header(record: Record) -> dict[str, object]:
    """The JSON header of `record`, or WalRecordError naming the record's position."""
    try:
        header = json.loads(record.header)
    except ValueError as exc:
        raise WalRecordError(
            f"WAL record at {record.position}: header is not JSON ({exc})"
        ) from None
    if not isinstance(header, dict) or header.get("v") not in _READABLE_VERSIONS:
        raise WalRecordError(f"WAL record at {record.position}: unknown header format")
    return header


def ranges_of(header: Mapping[str, object]) -> dict[tuple[str, int], OffsetRange]:
    raw = header["ranges"]
    assert isinstance(raw, list)
    return {(str(t), int(p)): OffsetRange(int(first), int(last)) for t, p, first, last in raw}


def decode(record: Record) -> WalBatch:
    """The batch stored in `record` (zero-copy over the record's payload), as written."""
    header = decode_header(record)
    payload = pa.py_buffer(record.payload)
    split = header["rows_ipc"]
    assert isinstance(split, int)
    try:
        rows = _read_one(payload.slice(0, split))
        dead = _read_one(payload.slice(split)) if header.get("dead") else None
    except (pa.ArrowInvalid, ValueError) as exc:
        raise WalRecordError(
            f"WAL record at {record.position}: Arrow payload unreadable ({exc})"
        ) from None
    stored = header.get("schema")
    return WalBatch(
        str(header["pipeline"]),
        ranges_of(header),
        rows,
        dead,
        stored if isinstance(stored, str) else fingerprint(rows.schema),
    )


def _read_one(buf: pa.Buffer) -> pa.RecordBatch:
    reader = pa.ipc.open_stream(buf)
    batches = list(reader)
    if len(batches) != 1:
        raise ValueError(f"expected one record batch, found {len(batches)}")
    return batches[0]


# How rows of an earlier schema become rows of the current one: per current column, the
# index of its source column, or None for a column filled with nulls.
_Sources = tuple[int | None, ...]


class SchemaConverter:
    """Converts WAL rows written under an earlier schema of the pipeline to its current one.

    Converts, keeping every value the rows hold:
    - a column added that is not required (Nullable, or `required = False`): null, which
      ClickHouse stores as the type's default for a non-Nullable column, as the decoder
      does for a field absent from a message; a nullable meta column (`_key`) likewise;
    - a column dropped, columns reordered, a column made Nullable.
    Refuses (`SchemaChangeError`): a column whose type changed, a required column added (a
    non-Nullable one, or `_topic` / `_timestamp`), a Nullable column made required.

    One plan per fingerprint: a large WAL pays the comparison once per schema it holds.
    """

    def __init__(self, pipeline: str, schema: PipelineSchema) -> None:
        self.pipeline = pipeline
        self.schema = schema.arrow_schema()
        self._clickhouse_types = dict(schema.clickhouse_columns())
        self._requirements = {
            **{c.name: c.is_required for c in schema.columns},
            **{f.name: not f.nullable for f in self.schema if f.name in schema.meta_names},
        }
        self._fingerprint = fingerprint(self.schema)
        self._plans: dict[str, _Sources] = {}

    def decode(self, record: Record) -> WalBatch:
        """The batch stored in `record`, its rows in the current schema (SchemaChangeError
        if they cannot be)."""
        return self.conform(decode(record), record.position)

    def conform(self, batch: WalBatch, position: Position) -> WalBatch:
        """`batch` (read from the WAL record at `position`) with its rows in the current
        schema; SchemaChangeError if the change since it was written is not convertible."""
        key = batch.fingerprint or fingerprint(batch.rows.schema)
        if key == self._fingerprint:
            return batch
        sources = self._plans.get(key)
        if sources is None:
            sources = self._plans[key] = self._plan(batch.rows.schema, key, position)
        rows = batch.rows
        columns = [
            pa.nulls(rows.num_rows, field.type) if source is None else rows.column(source)
            for source, field in zip(sources, self.schema, strict=True)
        ]
        converted = pa.RecordBatch.from_arrays(columns, schema=self.schema)
        return WalBatch(
            batch.pipeline, batch.ranges, converted, batch.dead_letters, self._fingerprint
        )

    def _plan(self, written: pa.Schema, key: str, position: Position) -> _Sources:
        sources: list[int | None] = []
        for field in self.schema:
            index = written.get_field_index(field.name)
            required = self._requirements[field.name]
            if index < 0:
                if required:
                    self._refuse(position, field, "is absent from the WAL and required now")
                sources.append(None)
                continue
            old = written.field(index)
            if old.type != field.type or (old.nullable and not field.nullable and required):
                self._refuse(
                    position, field, f"is {_describe(old)} in the WAL and {_describe(field)} now"
                )
            sources.append(index)
        kept = set(sources)
        log.info(
            "wal.schema_converted",
            pipeline=self.pipeline,
            fingerprint=key,
            position=str(position),
            added=[f.name for s, f in zip(sources, self.schema, strict=True) if s is None],
            dropped=[f.name for i, f in enumerate(written) if i not in kept],
        )
        return tuple(sources)

    def _refuse(self, position: Position, field: pa.Field, what: str) -> NoReturn:
        name = self.pipeline
        raise SchemaChangeError(
            f"pipeline {name!r}: WAL record at {position} holds rows the pipeline still needs "
            f"that its columns cannot take: column {field.name!r} {what} "
            f"({self._clickhouse_types[field.name]}). Rows convert when a column is added "
            "Nullable, dropped, reordered or made Nullable. To migrate: revert the column "
            "change and restart hakafka (the WAL is replayed and its pending block flushed "
            "under the old columns); stop hakafka with SIGTERM (its log shows no "
            "flush.abandoned: no block is left pending); move the pipeline's WAL directory "
            f"aside (`hakafka wal inspect --pipeline {name}` prints it; the rows it held past "
            "the checkpoint are read again from Kafka, which must still have them); then "
            "apply the change, ALTER the ClickHouse table to match and start hakafka. A "
            "retyped column can instead be added under a new name as Nullable."
        )


def _describe(field: pa.Field) -> str:
    return f"{field.type}, nullable" if field.nullable else str(field.type)
