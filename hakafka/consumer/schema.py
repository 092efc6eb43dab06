"""The pipeline schema and THE one mapping from ClickHouse type strings to Arrow types.

Supported ClickHouse types: Int8..Int64, UInt8..UInt64, Float32, Float64, Bool, String,
Date, Date32, DateTime[(tz)], DateTime64(p[, tz]), Decimal(p, s), Decimal32/64/128(s),
Nullable(T), LowCardinality(T) and Array(T). Anything else (FixedString, UUID, Enum, Map,
Tuple, ...) is rejected with a `SchemaError` naming the column and the type.

Text timestamps (JSON and CSV) are ISO-8601 strings; one without a UTC offset is read as UTC,
whatever time zone the column declares. Dates are `YYYY-MM-DD` strings.

Meta columns (`_topic`, `_partition`, `_offset`, `_timestamp`, `_key`) follow the declared
columns in the batch and in the table. `_partition` and `_offset` are always present, in the
Arrow batch and in the ClickHouse table alike, because exactly-once relies on them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import pyarrow as pa

from hakafka.consumer.errors import SchemaError

_INTEGERS: dict[str, pa.DataType] = {
    "Int8": pa.int8(),
    "Int16": pa.int16(),
    "Int32": pa.int32(),
    "Int64": pa.int64(),
    "UInt8": pa.uint8(),
    "UInt16": pa.uint16(),
    "UInt32": pa.uint32(),
    "UInt64": pa.uint64(),
}
_SIMPLE: dict[str, pa.DataType] = {
    **_INTEGERS,
    "Float32": pa.float32(),
    "Float64": pa.float64(),
    "Bool": pa.bool_(),
    "String": pa.string(),
}
_DECIMAL_PRECISION = {"Decimal32": 9, "Decimal64": 18, "Decimal128": 38}
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class ArrowType:
    """How one ClickHouse type lives in Arrow.

    `arrow` is the type in the decoded batch; `text` is the type text parsers (JSON, CSV)
    produce before a cast to `arrow` (they differ only where a parser lacks the final type).
    """

    arrow: pa.DataType
    text: pa.DataType
    nullable: bool


def _split_type(ch_type: str) -> tuple[str, list[str]]:
    """`Name(arg1, arg2(x, y))` -> (`Name`, [`arg1`, `arg2(x, y)`]), commas split at top level."""
    text = ch_type.strip()
    if "(" not in text:
        return text, []
    if not text.endswith(")"):
        raise ValueError("unbalanced parentheses")
    name, inner = text[: text.index("(")].strip(), text[text.index("(") + 1 : -1]
    args: list[str] = []
    depth, start = 0, 0
    for i, char in enumerate(inner):
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
            if depth < 0:
                raise ValueError("unbalanced parentheses")
        elif char == "," and depth == 0:
            args.append(inner[start:i].strip())
            start = i + 1
    if depth != 0:
        raise ValueError("unbalanced parentheses")
    args.append(inner[start:].strip())
    return name, args


def _time_zone(arg: str) -> str:
    zone = arg.strip()
    if len(zone) < 2 or zone[0] != zone[-1] or zone[0] not in "'\"":
        raise ValueError(f"time zone {arg!r} must be quoted")
    return zone[1:-1]


def _timestamp_unit(precision: int) -> str:
    if not 0 <= precision <= 9:
        raise ValueError(f"DateTime64 precision {precision} is not in 0..9")
    for limit, unit in ((0, "s"), (3, "ms"), (6, "us")):
        if precision <= limit:
            return unit
    return "ns"


def _map_type(ch_type: str) -> ArrowType:
    name, args = _split_type(ch_type)
    if name in _SIMPLE and not args:
        arrow = _SIMPLE[name]
        return ArrowType(arrow, arrow, nullable=False)
    if name == "Nullable" and len(args) == 1:
        inner = _map_type(args[0])
        if inner.nullable or pa.types.is_list(inner.arrow):
            raise ValueError(f"Nullable({args[0]}) is not allowed in ClickHouse")
        return ArrowType(inner.arrow, inner.text, nullable=True)
    if name == "LowCardinality" and len(args) == 1:
        return _map_type(args[0])
    if name == "Array" and len(args) == 1:
        item = _map_type(args[0])
        return ArrowType(pa.list_(item.arrow), pa.list_(item.text), nullable=False)
    if name in ("Date", "Date32") and not args:
        return ArrowType(pa.date32(), pa.timestamp("s"), nullable=False)
    if name == "DateTime" and len(args) <= 1:
        zone = _time_zone(args[0]) if args else None
        arrow = pa.timestamp("s", tz=zone)
        return ArrowType(arrow, arrow, nullable=False)
    if name == "DateTime64" and len(args) in (1, 2):
        zone = _time_zone(args[1]) if len(args) == 2 else None
        arrow = pa.timestamp(_timestamp_unit(int(args[0])), tz=zone)
        return ArrowType(arrow, arrow, nullable=False)
    if name == "Decimal" and len(args) == 2:
        return _decimal(int(args[0]), int(args[1]))
    if name in _DECIMAL_PRECISION and len(args) == 1:
        return _decimal(_DECIMAL_PRECISION[name], int(args[0]))
    raise ValueError("unsupported type")


def _decimal(precision: int, scale: int) -> ArrowType:
    if not 1 <= precision <= 38 or not 0 <= scale <= precision:
        raise ValueError(f"Decimal({precision}, {scale}) is out of range (precision 1..38)")
    arrow = pa.decimal128(precision, scale)
    return ArrowType(arrow, arrow, nullable=False)


def arrow_type(ch_type: str, *, column: str | None = None) -> ArrowType:
    """The Arrow form of ClickHouse type `ch_type`, or a `SchemaError` (naming `column` if
    given; a config check names the key instead)."""
    try:
        return _map_type(ch_type)
    except ValueError as exc:
        where = "" if column is None else f"column {column!r}: "
        raise SchemaError(
            f"{where}ClickHouse type {ch_type!r} is not supported ({exc}); "
            "supported: Int8..Int64, UInt8..UInt64, Float32/64, Bool, String, Date, Date32, "
            "DateTime[(tz)], DateTime64(p[, tz]), Decimal(p, s), Decimal32/64/128(s), "
            "Nullable(T), LowCardinality(T), Array(T)"
        ) from None


# (name, ClickHouse type) of every meta column, in the order they follow the declared columns.
META_COLUMNS: tuple[tuple[str, str], ...] = (
    ("_topic", "LowCardinality(String)"),
    ("_partition", "Int32"),
    ("_offset", "Int64"),
    ("_timestamp", "DateTime64(3)"),
    ("_key", "Nullable(String)"),
)
# Meta columns every batch and table carries: exactly-once counts (_partition, _offset).
ALWAYS_META: tuple[str, ...] = ("_partition", "_offset")
# Columns of `<table>_dead_letter`; `_value` holds the raw message bytes.
DEAD_LETTER_COLUMNS: tuple[tuple[str, str], ...] = (
    *META_COLUMNS,
    ("_value", "String"),
    ("_error", "String"),
)
# Kafka keys and raw values are arbitrary bytes: ClickHouse String, Arrow binary.
_BYTES_COLUMNS = frozenset({"_key", "_value"})


def _column_field(name: str, ch_type: str) -> pa.Field:
    mapped = arrow_type(ch_type, column=name)
    arrow = pa.binary() if name in _BYTES_COLUMNS else mapped.arrow
    return pa.field(name, arrow, nullable=mapped.nullable)


def dead_letter_arrow_schema() -> pa.Schema:
    """Arrow schema of dead-letter batches (`DEAD_LETTER_COLUMNS`)."""
    return pa.schema([_column_field(name, ch) for name, ch in DEAD_LETTER_COLUMNS])


@dataclass(frozen=True)
class ColumnSpec:
    """A declared column. `required` defaults to "the type is not Nullable".

    A required column absent or null in a message makes that message a bad one; a column
    that is not required may be absent (null, which ClickHouse turns into the type's default
    unless the column is Nullable).
    """

    name: str
    clickhouse_type: str
    required: bool | None = None

    @property
    def mapped(self) -> ArrowType:
        return arrow_type(self.clickhouse_type, column=self.name)

    @property
    def is_required(self) -> bool:
        return (not self.mapped.nullable) if self.required is None else self.required


@dataclass(frozen=True)
class PipelineSchema:
    """Declared columns plus the requested meta columns (`_partition`, `_offset` always)."""

    columns: tuple[ColumnSpec, ...]
    meta_columns: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if not self.columns:
            raise SchemaError("a pipeline schema needs at least one declared column")
        known = dict(META_COLUMNS)
        for name in self.meta_columns:
            if name not in known:
                raise SchemaError(f"meta column {name!r} is unknown; known: {sorted(known)}")
        seen: set[str] = set()
        for spec in self.columns:
            if not _NAME.match(spec.name) or spec.name.startswith("_"):
                raise SchemaError(
                    f"column name {spec.name!r} is invalid: use letters, digits and '_', "
                    "not starting with '_' (reserved for meta columns)"
                )
            if spec.name in seen:
                raise SchemaError(f"column {spec.name!r} is declared twice")
            seen.add(spec.name)
            mapped = spec.mapped  # raises SchemaError for unsupported types
            if spec.required and mapped.nullable:
                raise SchemaError(
                    f"column {spec.name!r}: required=True contradicts {spec.clickhouse_type}"
                )

    @classmethod
    def of(
        cls, columns: Iterable[tuple[str, str]], meta_columns: Sequence[str] = ()
    ) -> PipelineSchema:
        """Convenience: a schema from `(name, clickhouse_type)` pairs, required by type."""
        return cls(tuple(ColumnSpec(n, t) for n, t in columns), tuple(meta_columns))

    @property
    def meta_names(self) -> tuple[str, ...]:
        """Meta columns in the batch, in canonical order; always includes `ALWAYS_META`."""
        wanted = set(self.meta_columns) | set(ALWAYS_META)
        return tuple(name for name, _ in META_COLUMNS if name in wanted)

    def clickhouse_columns(self) -> list[tuple[str, str]]:
        """`(name, clickhouse_type)` of every table column: declared, then meta columns."""
        meta = dict(META_COLUMNS)
        return [(c.name, c.clickhouse_type) for c in self.columns] + [
            (name, meta[name]) for name in self.meta_names
        ]

    def declared_schema(self) -> pa.Schema:
        """Arrow schema of the declared columns only."""
        return pa.schema(
            [pa.field(c.name, c.mapped.arrow, nullable=c.mapped.nullable) for c in self.columns]
        )

    def text_schema(self) -> pa.Schema:
        """Arrow schema text parsers produce for the declared columns (before the cast)."""
        return pa.schema([pa.field(c.name, c.mapped.text) for c in self.columns])

    def arrow_schema(self) -> pa.Schema:
        """Arrow schema of decoded batches: declared columns, then `meta_names`."""
        meta = dict(META_COLUMNS)
        fields = list(self.declared_schema())
        fields += [_column_field(name, meta[name]) for name in self.meta_names]
        return pa.schema(fields)
