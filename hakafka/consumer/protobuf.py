"""`format = "protobuf"`: Protobuf messages in the Confluent wire format.

After the magic byte and the schema id comes the message-index array (zig-zag varints: a
count, then the path of indexes to the message type in the schema's file; the single byte 0
means the first message). The writer schema is fetched as a serialized FileDescriptorProto
(`format=serialized`) with its references (imports registered under their own subjects);
the well-known types come from the protobuf package. Each (schema id, index path) becomes a
message class of its own descriptor pool, built once per term.

Each message is parsed by the class's C parser (upb); columns are then read field by field
and built with one `pa.array` call per column and batch. A field with presence (a message,
`optional`, a wrapper such as `google.protobuf.Int64Value`) unset is null; a proto3 scalar
without presence is its value (0, "" when unset). Enums go into String columns by name and
into integer columns by number; `google.protobuf.Timestamp` into DateTime/DateTime64.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from hakafka.consumer.decode import DecodeOptions
from hakafka.consumer.errors import ConsumerError
from hakafka.consumer.registry import (
    HEADER_BYTES,
    RegisteredSchema,
    SchemaRegistry,
    group_by_id,
    unknown_id,
    wire_headers,
)
from hakafka.consumer.schema import PipelineSchema
from hakafka.consumer.wire import (
    WriterDecoder,
    WriterGroup,
    fits,
    mismatch,
    missing,
    null_columns,
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
    elif fd.type == _F.TYPE_MESSAGE:
        name = fd.message_type.full_name
        kind = "timestamp" if name == _TIMESTAMP else _WRAPPERS.get(name, "record")
    else:
        kind = _SCALAR_KINDS[fd.type]
    return f"array:{kind}" if fd.is_repeated else kind


def _fits(kind: str, target: pa.DataType) -> bool:
    if kind.endswith("enum"):
        scalar = target.value_type if pa.types.is_list(target) else target
        return kind.startswith("array:") == pa.types.is_list(target) and bool(
            pa.types.is_string(scalar) or pa.types.is_integer(scalar)
        )
    return fits(kind, target)


def _getter(fd: FieldDescriptor, target: pa.DataType) -> Callable[[Any], Any]:
    """Reads one column's value (None: null) from a parsed message."""
    name = fd.name
    scalar = target.value_type if pa.types.is_list(target) else target
    convert: Callable[[Any], Any] | None = None
    if fd.type == _F.TYPE_ENUM and pa.types.is_string(scalar):
        names = {v.number: v.name for v in fd.enum_type.values}
        convert = lambda n: names.get(n, str(n))  # noqa: E731 - an unknown number as text
    elif fd.type == _F.TYPE_MESSAGE and fd.message_type.full_name == _TIMESTAMP:
        convert = lambda ts: ts.seconds * 1_000_000 + ts.nanos // 1000  # noqa: E731
    elif fd.type == _F.TYPE_MESSAGE:
        convert = lambda wrapper: wrapper.value  # noqa: E731
    if fd.is_repeated:
        each = convert or (lambda v: v)
        return lambda m: [each(v) for v in getattr(m, name)]
    if fd.has_presence:
        if convert is None:
            return lambda m: getattr(m, name) if m.HasField(name) else None
        return lambda m: convert(getattr(m, name)) if m.HasField(name) else None
    if convert is None:
        return lambda m: getattr(m, name)
    return lambda m: convert(getattr(m, name))


@dataclass
class ProtobufWriter:
    """One message type of one writer schema, checked against the columns."""

    where: str
    declared: pa.Schema
    ch_types: dict[str, str]
    message: Descriptor | None = None
    problem: str | None = None
    _columns: list[tuple[str, Callable[[Any], Any], pa.DataType]] = field(default_factory=list)
    _parse: Callable[[bytes], Any] | None = None

    def __post_init__(self) -> None:
        if self.problem is not None or self.message is None:
            return
        fields = self.message.fields_by_name
        for column in self.declared:
            fd = fields.get(column.name)
            if fd is None:
                if not column.nullable:
                    self.problem = self.problem or missing(self.where, column.name)
                continue
            kind = _kind(fd)
            if not _fits(kind, column.type):
                self.problem = self.problem or mismatch(
                    self.where, column.name, kind, column.name, self.ch_types[column.name]
                )
            # Timestamps are read as microseconds, then cast to the column's unit.
            wire_type = pa.timestamp("us") if kind == "timestamp" else column.type
            self._columns.append((column.name, _getter(fd, column.type), wire_type))
        self._parse = message_factory.GetMessageClass(self.message).FromString

    def read(self, bodies: list[bytes]) -> pa.Table:
        assert self._parse is not None
        parse = self._parse
        messages = [parse(body) for body in bodies]
        arrays: dict[str, pa.Array] = {}
        for name, get, wire_type in self._columns:
            array = pa.array([get(m) for m in messages], wire_type)
            target = self.declared.field(name).type
            arrays[name] = array if wire_type == target else array.cast(target, safe=False)
        arrays.update(null_columns(self.declared, list(arrays), len(bodies)))
        return pa.Table.from_arrays(
            [arrays[name] for name in self.declared.names], schema=self.declared
        )


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
        self._ch_types = {c.name: c.clickhouse_type for c in schema.columns}
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
                if value[HEADER_BYTES] == 0:  # the common case: the first message type
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
        except (ValueError, TypeError, ConsumerError) as exc:
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
            else:  # a well-known type (google/protobuf/...), known to the protobuf package
                known = descriptor_pool.Default().FindFileByName(dep)
                dep_proto = descriptor_pb2.FileDescriptorProto()
                known.CopyToProto(dep_proto)
                pool.Add(dep_proto)
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
            writer = ProtobufWriter(where, self._declared, self._ch_types, problem=pool)
        else:
            try:
                message = _message_at(pool.FindFileByName(f"schema-{schema_id}.proto"), path)
            except (IndexError, KeyError):
                writer = ProtobufWriter(
                    where, self._declared, self._ch_types, problem=f"{where} does not exist"
                )
            else:
                writer = ProtobufWriter(
                    f"{where} ({message.full_name})", self._declared, self._ch_types, message
                )
        self._writers[key] = writer
        return writer


def _message_at(file: Any, path: tuple[int, ...]) -> Descriptor:
    """The message type at index path `path` of a file (nested types after the first)."""
    message: Descriptor = list(file.message_types_by_name.values())[path[0]]
    for index in path[1:]:
        message = message.nested_types[index]
    return message
