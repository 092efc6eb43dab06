"""The pipeline schema and THE one mapping from ClickHouse type strings to Arrow types.

Supported ClickHouse types and their Arrow form (what the decoded batch, the WAL, the buffer
and the insert hold):

| ClickHouse | Arrow |
|---|---|
| Int8..Int64, UInt8..UInt64, Float32/64, Bool, String | the same-width number, bool, string |
| Date, Date32; DateTime[(tz)]; DateTime64(p[, tz]) | date32; timestamp[s]; timestamp[unit of p] |
| Decimal(p, s), Decimal32/64/128(s) | decimal128(p, s) |
| UUID | string, lower-case `8-4-4-4-12` hex |
| IPv4, IPv6 | string: dotted quad; IPv6 text as ClickHouse prints it |
| Enum8/Enum16('name' = n, ...) | string (the name) |
| FixedString(N) | fixed_size_binary(N), zero-padded as ClickHouse stores it |
| JSON | string holding a JSON object |
| Array(T); Nested(a T, ...) | list<T>; list<struct<a: T, ...>> |
| Map(K, V) | map<K, V> |
| Tuple(a T, b U); Tuple(T, U) | struct<a: T, b: U>; struct<1: T, 2: U> |
| Nullable(T), LowCardinality(T) | T (nullable) |

Anything else is rejected with a `SchemaError` naming the column and the type.

Text timestamps (JSON and CSV) are ISO-8601 strings; one without a UTC offset is read as UTC,
whatever time zone the column declares. Dates are `YYYY-MM-DD` strings.

A column may take its value from a path in a JSON message (`user.id`, `items[0].sku`):
`ColumnSpec.path`, parsed by `parse_path`.

Meta columns (`_topic`, `_partition`, `_offset`, `_timestamp`, `_key`) follow the declared
columns in the batch and in the table. `_partition` and `_offset` are always present, in the
Arrow batch and in the ClickHouse table alike, because exactly-once relies on them.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

import pyarrow as pa

from chlib.chtypes import split_type, tuple_element
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
_ENUM_RANGE = {"Enum8": (-128, 127), "Enum16": (-32768, 32767)}
_ENUM_ITEM = re.compile(r"^'((?:[^'\\]|\\.)*)'\s*=\s*(-?\d+)$", re.DOTALL)
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_KEY = r"[^.\[\]]+(?:\[\d+\])*"
_PATH = re.compile(rf"{_KEY}(?:\.{_KEY})*")
_PATH_STEP = re.compile(r"([^.\[\]]+)|\[(\d+)\]")
SUPPORTED_TYPES = (
    "supported: Int8..Int64, UInt8..UInt64, Float32/64, Bool, String, Date, Date32, "
    "DateTime[(tz)], DateTime64(p[, tz]), Decimal(p, s), Decimal32/64/128(s), UUID, IPv4, "
    "IPv6, Enum8/Enum16(...), FixedString(N), JSON, Nullable(T), LowCardinality(T), Array(T), "
    "Map(K, V), Tuple(...), Nested(...)"
)


class Check(StrEnum):
    """A rule a parsed text value must pass before it becomes the column's value."""

    UUID = "UUID"
    IPV4 = "IPv4"
    IPV6 = "IPv6"
    ENUM = "Enum"
    FIXED_STRING = "FixedString"
    JSON = "JSON"


class Shape(StrEnum):
    """How an Arrow type nests its children (`ArrowType.children`)."""

    SCALAR = "scalar"
    LIST = "list"  # children: (item,)
    MAP = "map"  # children: (key, value)
    STRUCT = "struct"  # children: the fields


@dataclass(frozen=True)
class ArrowType:
    """How one ClickHouse type lives in Arrow.

    `arrow` is the type in the decoded batch; `text` is the type text parsers (JSON, CSV)
    produce before the conversion to `arrow` (they differ where a parser lacks the final
    type, or where a value must pass `check`). `children` are the mapped item, key and value,
    or fields (named as in `arrow`); `positional`: an unnamed Tuple (JSON gives it as an
    array); `enum_names` and `size` parameterize `check`.
    """

    arrow: pa.DataType
    text: pa.DataType
    nullable: bool
    shape: Shape = Shape.SCALAR
    children: tuple[ArrowType, ...] = ()
    check: Check | None = None
    enum_names: frozenset[str] = frozenset()
    size: int = 0
    positional: bool = False

    @property
    def converted(self) -> bool:
        """True if parsed text values need converting or checking (at any depth)."""
        return (
            self.arrow != self.text
            or self.check is not None
            or any(c.converted for c in self.children)
        )

    @property
    def needs_objects(self) -> bool:
        """True if no Arrow JSON parse can produce it (a Map, a JSON object or an unnamed
        Tuple, at any depth): JSON messages are then read as Python objects."""
        return (
            self.shape is Shape.MAP
            or self.check is Check.JSON
            or self.positional
            or any(c.needs_objects for c in self.children)
        )


def _scalar(arrow: pa.DataType, text: pa.DataType | None = None, **rule: object) -> ArrowType:
    return ArrowType(arrow, arrow if text is None else text, False, **rule)  # type: ignore[arg-type]


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


def _enum(name: str, args: list[str]) -> ArrowType:
    low, high = _ENUM_RANGE[name]
    names: set[str] = set()
    for arg in args:
        found = _ENUM_ITEM.match(arg.strip())
        if found is None:
            raise ValueError(f"{name} element {arg!r} is not 'name' = number")
        if not low <= int(found.group(2)) <= high:
            raise ValueError(f"{name} value {found.group(2)} is not in {low}..{high}")
        names.add(re.sub(r"\\(.)", r"\1", found.group(1)))
    if not names:
        raise ValueError(f"{name} needs at least one element")
    return _scalar(pa.string(), check=Check.ENUM, enum_names=frozenset(names))


def _fields(args: list[str], *, named_only: bool) -> tuple[list[tuple[str, ArrowType]], bool]:
    """The mapped elements of a Tuple or Nested and whether they are unnamed."""
    elements = [tuple_element(arg) for arg in args]
    names = [name for name, _ in elements]
    if not elements or (None in names and (named_only or any(names))):
        raise ValueError(
            "elements must be all named (name Type)" + ("" if named_only else " or all unnamed")
        )
    if len(set(names)) != len(names) and names[0] is not None:
        raise ValueError("element names must differ")
    positional = names[0] is None
    return [
        (str(i + 1) if positional else str(name), _map_type(inner))
        for i, (name, inner) in enumerate(elements)
    ], positional


def _struct(fields: list[tuple[str, ArrowType]], positional: bool) -> ArrowType:
    return ArrowType(
        pa.struct([pa.field(n, t.arrow) for n, t in fields]),
        pa.struct([pa.field(n, t.text) for n, t in fields]),
        nullable=False,
        shape=Shape.STRUCT,
        children=tuple(t for _, t in fields),
        positional=positional,
    )


def _list(item: ArrowType) -> ArrowType:
    return ArrowType(
        pa.list_(item.arrow),
        pa.list_(item.text),
        nullable=False,
        shape=Shape.LIST,
        children=(item,),
    )


def _map_type(ch_type: str) -> ArrowType:
    name, args = split_type(ch_type)
    if name in _SIMPLE and not args:
        return _scalar(_SIMPLE[name])
    if name == "Nullable" and len(args) == 1:
        inner = _map_type(args[0])
        if inner.nullable or inner.shape is not Shape.SCALAR or inner.check is Check.JSON:
            raise ValueError(f"Nullable({args[0]}) is not allowed in ClickHouse")
        return dataclasses.replace(inner, nullable=True)
    if name == "LowCardinality" and len(args) == 1:
        return _map_type(args[0])
    if name == "Array" and len(args) == 1:
        return _list(_map_type(args[0]))
    if name in ("Date", "Date32") and not args:
        return _scalar(pa.date32(), pa.timestamp("s"))
    if name == "DateTime" and len(args) <= 1:
        zone = _time_zone(args[0]) if args else None
        return _scalar(pa.timestamp("s", tz=zone))
    if name == "DateTime64" and len(args) in (1, 2):
        zone = _time_zone(args[1]) if len(args) == 2 else None
        return _scalar(pa.timestamp(_timestamp_unit(int(args[0])), tz=zone))
    if name == "Decimal" and len(args) == 2:
        return _decimal(int(args[0]), int(args[1]))
    if name in _DECIMAL_PRECISION and len(args) == 1:
        return _decimal(_DECIMAL_PRECISION[name], int(args[0]))
    if name in ("UUID", "IPv4", "IPv6", "JSON") and not args:
        return _scalar(pa.string(), check=Check(name))
    if name in _ENUM_RANGE:
        return _enum(name, args)
    if name == "FixedString" and len(args) == 1:
        size = int(args[0])
        if size < 1:
            raise ValueError("FixedString(N) needs N >= 1")
        return _scalar(pa.binary(size), pa.string(), check=Check.FIXED_STRING, size=size)
    if name == "Map" and len(args) == 2:
        key, value = _map_type(args[0]), _map_type(args[1])
        if key.nullable or key.shape is not Shape.SCALAR or key.check is Check.JSON:
            raise ValueError(f"Map key type {args[0]} is not allowed")
        return ArrowType(
            pa.map_(key.arrow, value.arrow),
            pa.map_(key.text, value.text),
            nullable=False,
            shape=Shape.MAP,
            children=(key, value),
        )
    if name == "Tuple" and args:
        return _struct(*_fields(args, named_only=False))
    if name == "Nested" and args:
        fields, _ = _fields(args, named_only=True)
        return _list(_struct(fields, positional=False))
    raise ValueError("unsupported type")


def _decimal(precision: int, scale: int) -> ArrowType:
    if not 1 <= precision <= 38 or not 0 <= scale <= precision:
        raise ValueError(f"Decimal({precision}, {scale}) is out of range (precision 1..38)")
    return _scalar(pa.decimal128(precision, scale))


def arrow_type(ch_type: str, *, column: str | None = None) -> ArrowType:
    """The Arrow form of ClickHouse type `ch_type`, or a `SchemaError` (naming `column` if
    given; a config check names the key instead)."""
    try:
        return _map_type(ch_type)
    except ValueError as exc:
        where = "" if column is None else f"column {column!r}: "
        raise SchemaError(
            f"{where}ClickHouse type {ch_type!r} is not supported ({exc}); {SUPPORTED_TYPES}"
        ) from None


def parse_path(path: str) -> tuple[str | int, ...]:
    """`user.id` -> ("user", "id"); `items[0].sku` -> ("items", 0, "sku"): object keys
    (any text without `.`, `[`, `]`) and array indexes (from 0); ValueError says what is
    wrong."""
    if not _PATH.fullmatch(path):
        raise ValueError(
            f"path {path!r} is not keys joined by '.', each optionally followed by [index]s "
            "(like user.id or items[0].sku)"
        )
    return tuple(key if key else int(index) for key, index in _PATH_STEP.findall(path))


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
    unless the column is Nullable). `path` (JSON only): where in the message the value is,
    as `parse_path` reads it; empty: the top-level field named like the column.
    """

    name: str
    clickhouse_type: str
    required: bool | None = None
    path: str = ""

    @property
    def mapped(self) -> ArrowType:
        return arrow_type(self.clickhouse_type, column=self.name)

    @property
    def steps(self) -> tuple[str | int, ...]:
        """The parsed `path` (the column's name when empty)."""
        try:
            return parse_path(self.path) if self.path else (self.name,)
        except ValueError as exc:
            raise SchemaError(f"column {self.name!r}: {exc}") from None

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
            spec.steps  # noqa: B018 -- raises SchemaError for a malformed path
            if spec.required and mapped.nullable:
                raise SchemaError(
                    f"column {spec.name!r}: required=True contradicts {spec.clickhouse_type}"
                )

    @classmethod
    def of(
        cls,
        columns: Iterable[tuple[str, str]],
        meta_columns: Sequence[str] = (),
        paths: Mapping[str, str] | None = None,
    ) -> PipelineSchema:
        """Convenience: a schema from `(name, clickhouse_type)` pairs, required by type, with
        the `paths` of the columns that have one."""
        paths = paths or {}
        return cls(
            tuple(ColumnSpec(n, t, path=paths.get(n, "")) for n, t in columns),
            tuple(meta_columns),
        )

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
