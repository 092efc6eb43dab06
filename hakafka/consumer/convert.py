"""Parsed columns into their final types, every value checked as ClickHouse would check it
on insert (UUID, IPv4 and IPv6 addresses, Enum names, FixedString lengths, JSON objects,
Dates without a time of day), at any depth of Array, Map and Tuple.

A bad value raises `ChunkError` naming the column, the value's place in it and its row: the
bisection of a failing chunk (`batch.BatchDecoder`) splits the chunk there.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from hakafka.consumer.schema import ArrowType, Check, Shape
from hakafka.consumer.shown import shown

_UUID = r"^[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}$"
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_IPV4 = rf"^{_OCTET}\.{_OCTET}\.{_OCTET}\.{_OCTET}$"
# What building a column's text values from Python values (`pa.array`) raises for a bad one.
CONVERSION_ERRORS = (pa.ArrowException, ValueError, TypeError, OverflowError)


class ChunkError(ValueError):
    """A chunk of messages does not parse into exactly one row per message."""


class _BadValueError(ValueError):
    """Value `index` of an array fails its column type; `position` locates it in the row."""

    def __init__(self, index: int, reason: str, position: str = "") -> None:
        super().__init__(reason)
        self.index = index
        self.reason = reason
        self.position = position


def convert_column(column: pa.ChunkedArray, mapped: ArrowType, name: str) -> pa.ChunkedArray:
    """A parsed column (`mapped.text`) as its final type (`mapped.arrow`), every value
    checked; a bad one raises `ChunkError` naming the column, the value's position in it
    and the row (for the bisection)."""
    chunks = []
    start = 0
    for chunk in column.chunks:
        try:
            chunks.append(convert_array(chunk, mapped))
        except _BadValueError as bad:
            raise ChunkError(
                f"column {name!r}{bad.position}: {bad.reason} in row {start + bad.index}"
            ) from None
        start += len(chunk)
    return pa.chunked_array(chunks, mapped.arrow)


def convert_array(array: pa.Array, mapped: ArrowType) -> pa.Array:
    """`array` (of `mapped.text`) as `mapped.arrow`, every value checked (nested ones too);
    a bad one raises a ValueError (`_BadValueError`: its index, its place inside the value)."""
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
                children.append(convert_array(child, field_type))
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
            return convert_array(values.slice(first, last - first), item)
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
    raise _BadValueError(index, f"{shown(values[index].as_py())} is not {what}")


def _convert_scalar(array: pa.Array, mapped: ArrowType) -> pa.Array:
    """A scalar `array` through its type's check (`mapped.check`) or cast to `mapped.arrow`;
    `_BadValueError` for the first value that fails."""
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
            raise _BadValueError(index, f"{shown(value)} is not {what}")
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
    """`value` itself if it is the text of a JSON object, else None."""
    try:
        parsed = json.loads(value)
    except ValueError:
        return None
    return value if isinstance(parsed, dict) else None
