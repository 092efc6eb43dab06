"""Where a column's value lies in a JSON message (its `path`), for both readers of a message:
the tree of every column's path (`check_paths`: no two overlap; `parse_schema`: what Arrow's
JSON reader parses), the values at a path in Arrow's parse (`at_path`), and in messages the
`json` module parsed (`follow`, `text_value`, `object_column`).
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from hakafka.consumer.convert import CONVERSION_ERRORS, ChunkError
from hakafka.consumer.errors import SchemaError
from hakafka.consumer.schema import ArrowType, Check, ColumnSpec, Shape
from hakafka.consumer.shown import shown

Steps = tuple[str | int, ...]  # keys and indexes from a JSON message's root


@dataclass
class _PathNode:
    """One place in the messages that columns read: a leaf (`column`) or a container of
    `keys` (an object) or of `item` (an array)."""

    column: ColumnSpec | None = None
    keys: dict[str, _PathNode] | None = None
    item: _PathNode | None = None

    def arrow_text(self) -> pa.DataType:
        """The Arrow type Arrow's JSON reader parses this place as."""
        if self.column is not None:
            return self.column.mapped.text
        if self.item is not None:
            return pa.list_(self.item.arrow_text())
        return pa.struct([(k, n.arrow_text()) for k, n in (self.keys or {}).items()])


def _path_tree(columns: Sequence[ColumnSpec]) -> _PathNode:
    """The paths of `columns` merged into one tree; SchemaError if two overlap (one reads
    inside the other's value, or both the same place)."""
    root = _PathNode(keys={})
    for column in columns:
        node = root
        for step in column.steps:
            if node.column is not None:
                _overlap(node.column, column)
            if isinstance(step, int):
                if node.keys:
                    _overlap(_a_column(node), column)
                node.item = node.item or _PathNode()
                node = node.item
            else:
                if node.item is not None:
                    _overlap(_a_column(node), column)
                node.keys = {} if node.keys is None else node.keys
                node = node.keys.setdefault(step, _PathNode())
        if node.column is not None or node.keys or node.item is not None:
            _overlap(_a_column(node), column)
        node.column = column
    return root


def _a_column(node: _PathNode) -> ColumnSpec:
    """A column at or below `node` (there is one: only columns make nodes)."""
    while node.column is None:
        node = node.item if node.item is not None else next(iter((node.keys or {}).values()))
    return node.column


def _overlap(first: ColumnSpec, second: ColumnSpec) -> None:
    """Raise the SchemaError of two columns whose paths overlap."""
    raise SchemaError(
        f"columns {first.name!r} (path {_path_text(first)}) and {second.name!r} (path "
        f"{_path_text(second)}) overlap: a column may not read the same value as another, "
        "or a value inside another's"
    )


def _path_text(column: ColumnSpec) -> str:
    """`column`'s path as configured (its name when it has none)."""
    return column.path or column.name


def check_paths(columns: Sequence[ColumnSpec]) -> None:
    """SchemaError if the paths of two of `columns` overlap."""
    _path_tree(columns)


def parse_schema(columns: Sequence[ColumnSpec]) -> pa.Schema:
    """The explicit schema Arrow's JSON reader parses `columns` (at their paths) with."""
    tree = _path_tree(columns)
    return pa.schema([(k, n.arrow_text()) for k, n in (tree.keys or {}).items()])


def at_path(column: pa.ChunkedArray, steps: Steps) -> pa.Array:
    """The values at `steps[1:]` inside the parsed top-level field `column` (null where a
    step is absent, null or past an array's end)."""
    array = column.combine_chunks() if len(steps) > 1 else column
    for step in steps[1:]:
        if isinstance(step, str):
            array = array.flatten()[array.type.get_field_index(step)]
        else:
            offsets = array.offsets.to_numpy()
            present = np.diff(offsets) > step
            if array.null_count:
                present &= array.is_valid().to_numpy(zero_copy_only=False)
            array = array.values.take(pa.array(offsets[:-1] + step, pa.int64(), mask=~present))
    return array


def object_column(messages: list[object], column: ColumnSpec) -> pa.Array:
    """`column` from messages parsed by `json`, in its text type."""
    mapped, steps = column.mapped, column.steps
    try:
        values = [text_value(follow(m, steps), mapped) for m in messages]
        return pa.array(values, mapped.text)
    except CONVERSION_ERRORS as exc:
        raise ChunkError(f"column {column.name!r}: {exc}") from None


def follow(message: object, steps: Steps) -> object:
    """The value at `steps` in `message` (parsed by `json`); None where a step finds no key,
    no such item, or not an object or array."""
    value = message
    for step in steps:
        if isinstance(step, str):
            value = value.get(step) if isinstance(value, dict) else None
        else:
            value = value[step] if isinstance(value, list) and step < len(value) else None
    return value


def text_value(value: object, mapped: ArrowType) -> object:
    """A JSON value as the Python value Arrow builds `mapped.text` from; ValueError names a
    value of the wrong shape."""
    if value is None:
        return None
    if mapped.shape is Shape.LIST:
        if not isinstance(value, list):
            raise ValueError(f"{shown(value)} is not an array")
        return [text_value(v, mapped.children[0]) for v in value]
    if mapped.shape is Shape.MAP:
        if not isinstance(value, dict):
            raise ValueError(f"{shown(value)} is not an object (Map)")
        key_type, value_type = mapped.children
        numeric = pa.types.is_integer(key_type.text)
        return [(int(k) if numeric else k, text_value(v, value_type)) for k, v in value.items()]
    if mapped.shape is Shape.STRUCT:
        names = [f.name for f in mapped.arrow]
        if mapped.positional:
            if not isinstance(value, list) or len(value) != len(names):
                raise ValueError(f"{shown(value)} is not an array of {len(names)} (Tuple)")
            items = value
        elif isinstance(value, dict):
            items = [value.get(n) for n in names]
        else:
            raise ValueError(f"{shown(value)} is not an object (Tuple)")
        return {n: text_value(v, t) for n, v, t in zip(names, items, mapped.children, strict=True)}
    if mapped.check is Check.JSON:
        if not isinstance(value, dict):
            raise ValueError(f"{shown(value)} is not a JSON object")
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    if pa.types.is_timestamp(mapped.text) and isinstance(value, str):
        parsed = dt.datetime.fromisoformat(value)
        return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)
    return value
