"""`format = "protobuf"`: Protobuf messages in the Confluent wire format.

After the magic byte and the schema id comes the message-index array (zig-zag varints: a
count, then the path of indexes to the message type in the schema's file; the single byte 0
means the first message). The writer schema is fetched as a serialized FileDescriptorProto
(`format=serialized`) with its references (imports registered under their own subjects);
the well-known types come from the protobuf package. Each (schema id, index path) becomes a
message class of its own descriptor pool, built once per term.

Each message is parsed by the class's C parser (upb); each column is then read over the
batch's messages with C-level getters (`map(attrgetter)`, presence with `methodcaller
("HasField")`, timestamps and enum names with numpy) and built with one `pa.array` call.
A field with presence (a message, `optional`, a wrapper such as `google.protobuf.Int64Value`)
unset is null; a proto3 scalar without presence is its value (0, "" when unset). Enums go
into String columns by name and into integer columns by number; `google.protobuf.Timestamp`
into DateTime/DateTime64; `map<K, V>` with scalar values into Map. Other message fields
(Tuple columns) are not read from Protobuf: such a column refuses the writer.
"""

from __future__ import annotations

import base64
import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from operator import attrgetter, methodcaller
from typing import Any

import numpy as np
import pyarrow as pa
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from hakafka.consumer.convert import CONVERSION_ERRORS
from hakafka.consumer.errors import ConsumerError
from hakafka.consumer.options import DecodeOptions
from hakafka.consumer.registry import (
    HEADER_BYTES,
    RegisteredSchema,
    SchemaRegistry,
    group_by_id,
    unknown_id,
    wire_headers,
)
from hakafka.consumer.schema import ColumnSpec, PipelineSchema
from hakafka.consumer.wire import (
    WriterDecoder,
    WriterGroup,
    misfit,
    mismatch,
    missing,
    plan_column,
    table_of,
)

_F = FieldDescriptor
_SCALAR_KINDS = {
    _F.TYPE_BOOL: "bool",
    _F.TYPE_FLOAT: "float",
    _F.TYPE_DOUBLE: "float",
    _F.TYPE_STRING: "string",
    _F.TYPE_BYTES: "bytes",
    **dict.fromkeys(
        (
            _F.TYPE_INT32,
            _F.TYPE_INT64,
            _F.TYPE_UINT32,
            _F.TYPE_UINT64,
            _F.TYPE_SINT32,
            _F.TYPE_SINT64,
            _F.TYPE_FIXED32,
            _F.TYPE_FIXED64,
            _F.TYPE_SFIXED32,
            _F.TYPE_SFIXED64,
        ),
        "int",
    ),
}
_TIMESTAMP = "google.protobuf.Timestamp"
_WRAPPERS = {
    f"google.protobuf.{name}Value": kind
    for name, kind in (
        ("Double", "float"),
        ("Float", "float"),
        ("Int64", "int"),
        ("UInt64", "int"),
        ("Int32", "int"),
        ("UInt32", "int"),
        ("Bool", "bool"),
        ("String", "string"),
        ("Bytes", "bytes"),
    )
}


def _kind(fd: FieldDescriptor) -> str:
    """The `wire.fits` kind of a field (enums: "enum", by name or number)."""
    if fd.type == _F.TYPE_ENUM:
        kind = "enum"
    elif _is_scalar_map(fd):
        return "map"
    elif fd.type == _F.TYPE_MESSAGE:
        name = fd.message_type.full_name
        kind = "timestamp" if name == _TIMESTAMP else _WRAPPERS.get(name, "record")
    else:
        kind = _SCALAR_KINDS[fd.type]
    return f"array:{kind}" if fd.is_repeated else kind


def _is_scalar_map(fd: FieldDescriptor) -> bool:
    """A `map<K, V>` field whose values are scalars (read as a dict per message)."""
    entry = fd.message_type if fd.type == _F.TYPE_MESSAGE else None
    return bool(
        entry is not None
        and entry.GetOptions().map_entry
        and entry.fields_by_name["value"].type in _SCALAR_KINDS
    )


Column = Callable[[list[Any]], pa.Array]


def _column(fd: FieldDescriptor, target: pa.DataType) -> Column:
    """Reads one column from parsed messages: `map` with C-level getters (attrgetter,
    methodcaller), numpy for timestamps and enum names, one `pa.array` per batch."""
    name = fd.name
    is_timestamp = fd.type == _F.TYPE_MESSAGE and fd.message_type.full_name == _TIMESTAMP
    if _is_scalar_map(fd):
        entries = attrgetter(name)
        return lambda ms: pa.array(list(map(dict, map(entries, ms))), target)
    # Timestamps are read as microseconds, then cast to the column's unit.
    wire = pa.timestamp("us") if is_timestamp else (target.value_type if fd.is_repeated else target)
    if fd.is_repeated and fd.type in _SCALAR_KINDS:  # lists of plain values: no Python per row
        plain = attrgetter(name)
        return lambda ms: pa.array(list(map(list, map(plain, ms))), target)
    if fd.is_repeated:  # enums, timestamps, wrappers: element by element
        each, get = _scalar(fd, target.value_type), attrgetter(name)
        wire_list = pa.list_(wire) if is_timestamp else target

        def read_lists(messages: list[Any]) -> pa.Array:
            rows = [each(list(v)) for v in map(get, messages)]
            lists = [r.to_pylist() if isinstance(r, pa.Array) else r for r in rows]
            array = pa.array(lists, wire_list)
            return array if wire_list == target else array.cast(target, safe=False)

        return read_lists
    has = methodcaller("HasField", name) if fd.has_presence else None
    values = _scalar(fd, target)

    def read(messages: list[Any]) -> pa.Array:
        mask = None
        if has is not None:
            present = np.fromiter(map(has, messages), bool, len(messages))
            mask = None if present.all() else ~present
        array = values(messages)
        array = pa.array(array, wire, mask=mask) if mask is not None else pa.array(array, wire)
        return array if wire == target else array.cast(target, safe=False)

    return read


def _scalar(fd: FieldDescriptor, target: pa.DataType) -> Callable[[list[Any]], Any]:
    """Values of field `fd` (unset: its default) of each message, or of each element of a
    repeated field, as something `pa.array` takes."""
    if fd.type == _F.TYPE_ENUM and pa.types.is_string(target):
        names = {v.number: v.name for v in fd.enum_type.values}

        def enum_names(items: list[Any]) -> pa.Array:
            numbers = np.fromiter(map(_field(fd), items), np.int64, len(items))
            distinct, which = np.unique(numbers, return_inverse=True)
            # A number the schema does not name (a newer writer's value) is kept as text.
            labels = pa.array([names.get(int(n), str(int(n))) for n in distinct], pa.string())
            return labels.take(pa.array(which))

        return enum_names
    if fd.type == _F.TYPE_MESSAGE and fd.message_type.full_name == _TIMESTAMP:
        seconds, nanos = _field(fd, "seconds"), _field(fd, "nanos")

        def micros(items: list[Any]) -> np.ndarray:
            whole = np.fromiter(map(seconds, items), np.int64, len(items))
            return whole * 1_000_000 + np.fromiter(map(nanos, items), np.int64, len(items)) // 1000

        return micros
    get = _field(fd, "value") if fd.type == _F.TYPE_MESSAGE else _field(fd)  # a wrapper
    return lambda items: list(map(get, items))


def _field_value(message: Any, fd: FieldDescriptor) -> object:
    """Field `fd` of `message` as plain Python values: a repeated field as a list, a map as
    a dict, a wrapper (`google.protobuf.Int64Value`, ...) as its value."""
    value = getattr(message, fd.name)
    if _is_scalar_map(fd):
        return dict(value)
    items = list(value) if fd.is_repeated else [value]
    if fd.type == _F.TYPE_MESSAGE and fd.message_type.full_name in _WRAPPERS:
        items = [item.value for item in items]
    return items if fd.is_repeated else items[0]


def _field(fd: FieldDescriptor, inner: str = "") -> Callable[[Any], Any]:
    """A getter of field `fd` of a message (`inner`: of its sub-message), or of an element
    itself when `fd` is repeated (the elements are the values)."""
    if fd.is_repeated:
        return attrgetter(inner) if inner else (lambda v: v)
    return attrgetter(f"{fd.name}.{inner}" if inner else fd.name)


@dataclass
class ProtobufWriter:
    """One message type of one writer schema, checked against the columns."""

    where: str
    columns: tuple[ColumnSpec, ...]
    declared: pa.Schema
    message: Descriptor | None = None
    problem: str | None = None
    _readers: dict[str, Column] = field(default_factory=dict)
    _converted: set[str] = field(default_factory=set)
    _parse: Callable[[bytes], Any] | None = None

    def __post_init__(self) -> None:
        if self.problem is not None or self.message is None:
            return
        fields = self.message.fields_by_name
        for column in self.columns:
            fd = fields.get(column.name)
            if fd is None:
                if column.is_required:
                    self.problem = self.problem or missing(self.where, column.name)
                continue
            kind = _kind(fd)
            plan = plan_column(kind, column.mapped)
            if plan is None:
                self.problem = self.problem or mismatch(
                    self.where, column.name, kind, column.name, column.clickhouse_type
                )
                continue
            self._readers[column.name] = _column(fd, plan.build)
            if plan.convert:
                self._converted.add(column.name)
        self._parse = message_factory.GetMessageClass(self.message).FromString

    @property
    def converted(self) -> frozenset[str]:
        return frozenset(self._converted)

    def read(self, bodies: list[bytes]) -> pa.Table:
        assert self._parse is not None
        messages = list(map(self._parse, bodies))
        arrays: dict[str, pa.Array] = {}
        for name, read in self._readers.items():
            try:
                arrays[name] = read(messages)
            except CONVERSION_ERRORS:
                if len(messages) != 1:
                    raise
                assert self.message is not None
                value = _field_value(messages[0], self.message.fields_by_name[name])
                column = next(c for c in self.columns if c.name == name)
                raise ValueError(misfit(column, value)) from None
        return table_of(self.declared, arrays, len(bodies))


def message_indexes(value: bytes) -> tuple[tuple[int, ...], int]:
    """The message-index path after the 5-byte header and where the body starts; ValueError
    if the array is cut short."""
    pos = HEADER_BYTES

    def varint() -> int:
        nonlocal pos
        shift = result = 0
        while True:
            if pos >= len(value):
                raise ValueError("message-index array cut short")
            byte = value[pos]
            pos += 1
            result |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return (result >> 1) ^ -(result & 1)  # zig-zag
            shift += 7

    count = varint()
    if count < 0 or count > 100:
        raise ValueError(f"message-index array of {count} entries")
    path = tuple(varint() for _ in range(count)) if count else (0,)
    return path, pos


class ProtobufDecoder(WriterDecoder):
    """Confluent-framed Protobuf; writer schemas by id from `registry`."""

    def __init__(
        self,
        schema: PipelineSchema,
        options: DecodeOptions | None = None,
        *,
        registry: SchemaRegistry,
    ) -> None:
        super().__init__(schema, options)
        self._registry = registry
        self._files: dict[int, descriptor_pool.DescriptorPool | str | None] = {}
        self._writers: dict[tuple[int, tuple[int, ...]], ProtobufWriter] = {}

    def _groups(self, values: list[bytes]) -> tuple[list[WriterGroup], dict[int, str]]:
        ids, problems = wire_headers(values)
        good = [p for p in range(len(values)) if p not in problems]
        by_writer: dict[tuple[int, tuple[int, ...]], WriterGroup] = {}
        for schema_id, positions in group_by_id(ids, good).items():
            pool = self._pool(schema_id)  # RegistryUnavailableError: nothing decided yet
            if pool is None:
                problems.update(dict.fromkeys(positions, unknown_id(schema_id)))
                continue
            for p in positions:
                value = values[p]
                path: tuple[int, ...]
                if value[HEADER_BYTES : HEADER_BYTES + 1] == b"\x00":  # the first message type
                    path, start = (0,), HEADER_BYTES + 1
                else:
                    try:
                        path, start = message_indexes(value)
                    except ValueError as exc:
                        problems[p] = f"schema id {schema_id}: {exc}"
                        continue
                key = (schema_id, path)
                group = by_writer.get(key)
                if group is None:
                    group = by_writer[key] = WriterGroup(self._writer(key, pool), [], [])
                group.positions.append(p)
                group.bodies.append(value[start:])
        return list(by_writer.values()), problems

    def _pool(self, schema_id: int) -> descriptor_pool.DescriptorPool | str | None:
        """The descriptor pool of writer schema `schema_id` (its file is named by its id),
        the reason it cannot be used, or None if the registry does not know the id."""
        if schema_id not in self._files:
            found = self._registry.by_id(schema_id, fmt="serialized")
            self._files[schema_id] = None if found is None else self._build_pool(found)
        return self._files[schema_id]

    def _build_pool(self, found: RegisteredSchema) -> descriptor_pool.DescriptorPool | str:
        where = f"writer schema {found.schema_id}"
        if found.schema_type != "PROTOBUF":
            return f"{where} is {found.schema_type}, not Protobuf"
        pool = descriptor_pool.DescriptorPool()
        try:
            self._add(pool, found, f"schema-{found.schema_id}.proto", set())
        except (ValueError, TypeError, KeyError, ConsumerError) as exc:
            return f"{where} is not a usable Protobuf schema: {exc}"
        return pool

    def _add(
        self,
        pool: descriptor_pool.DescriptorPool,
        schema: RegisteredSchema,
        name: str,
        added: set[str],
    ) -> None:
        """Add `schema` as file `name`, after its references and well-known imports."""
        proto = descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(schema.text))
        proto.name = name
        refs = {ref_name: (subject, version) for ref_name, subject, version in schema.references}
        for dep in proto.dependency:
            if dep in added:
                continue
            added.add(dep)
            if dep in refs:
                ref = self._registry.version(*refs[dep], fmt="serialized")
                self._add(pool, ref, dep, added)
            else:
                pool.Add(_well_known(dep))
        pool.Add(proto)

    def _writer(
        self, key: tuple[int, tuple[int, ...]], pool: descriptor_pool.DescriptorPool | str
    ) -> ProtobufWriter:
        found = self._writers.get(key)
        if found is not None:
            return found
        schema_id, path = key
        where = f"writer schema {schema_id} message {list(path)}"
        if isinstance(pool, str):
            writer = ProtobufWriter(where, (), self._declared, problem=pool)
        else:
            try:
                message = _message_at(pool.FindFileByName(f"schema-{schema_id}.proto"), path)
            except (IndexError, KeyError):
                writer = ProtobufWriter(
                    where, (), self._declared, problem=f"{where} does not exist"
                )
            else:
                writer = ProtobufWriter(
                    f"{where} ({message.full_name})", self.schema.columns, self._declared, message
                )
        self._writers[key] = writer
        return writer


def _well_known(name: str) -> descriptor_pb2.FileDescriptorProto:
    """The descriptor of an import that is no reference: a well-known type of the protobuf
    package (`google/protobuf/timestamp.proto` is module `google.protobuf.timestamp_pb2`)."""
    module = name.removeprefix("google/protobuf/").removesuffix(".proto")
    if not name.startswith("google/protobuf/") or not module.isidentifier():
        raise ConsumerError(f"imports {name}, which is neither a reference nor a well-known type")
    try:
        known = importlib.import_module(f"google.protobuf.{module}_pb2")
    except ImportError:
        raise ConsumerError(f"imports {name}, unknown to the protobuf package") from None
    return descriptor_pb2.FileDescriptorProto.FromString(known.DESCRIPTOR.serialized_pb)


def _message_at(file: Any, path: tuple[int, ...]) -> Descriptor:
    """The message type at index path `path` of a file (nested types after the first)."""
    message: Descriptor = list(file.message_types_by_name.values())[path[0]]
    for index in path[1:]:
        message = message.nested_types[index]
    return message
