"""Why a JSON message is bad, once the bisection has it alone (`json_misfit`): the first
column whose value does not fit, named with the JSON Pointer to that value and what was
expected and found (`column 'user_id' (JSON /user/id): expected UInt64, got string "x"`),
or the byte where the message stops being JSON.

It replays, on the message the `json` module parsed, what Arrow's JSON reader and then
`convert_column` do with each column's value; that costs work only for bad messages.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.json as pjson

from chlib.chtypes import split_type, tuple_element
from hakafka.consumer.convert import CONVERSION_ERRORS, convert_array
from hakafka.consumer.json_paths import Steps, follow, text_value
from hakafka.consumer.schema import ArrowType, Check, ColumnSpec, Shape
from hakafka.consumer.shown import bare_type, json_shown

_ONE_THREAD = pjson.ReadOptions(use_threads=False)
_ReadScalar = Callable[[object, ArrowType], pa.Array]  # a scalar into its type's text form


def json_misfit(value: bytes, columns: Sequence[tuple[ColumnSpec, ArrowType]]) -> str | None:
    """Why the single message `value` (valid UTF-8) is bad: the first of `columns` (each with
    its `mapped` type, in declared order) whose value in it does not fit, named with the JSON
    Pointer to that value; or where `value` is not one JSON object; None if the `json` module
    reads it and finds nothing wrong (Arrow's error then stands)."""
    text = value.decode()
    try:
        message = json.loads(text)
    except json.JSONDecodeError as exc:
        return f"not valid JSON at byte {len(text[: exc.pos].encode())}: {exc.msg}"
    except RecursionError:  # nested deeper than Python's stack; Arrow's text says why
        return None
    if not isinstance(message, dict):
        return _Misfit((), "a JSON object", message).text()
    for column, mapped in columns:
        if mapped.needs_objects:
            found = _value_misfit(
                follow(message, column.steps),
                mapped,
                bare_type(column.clickhouse_type),
                column.steps,
                _object_scalar,
                checks=True,
            )
        else:
            found = _parsed_misfit(message, column, mapped)
        if found is not None:
            return _json_reason(column, found)
    return None


def _items(value: object, mapped: ArrowType) -> list[tuple[str | int, object, int]] | None:
    """The contents of `value` read as the container `mapped` (Array, Map, Tuple), as
    `text_value` reads them: for each, its step (index or key), its value and the index of its
    type in `mapped.children` (of a Map entry: its value's). None if `value` is not the JSON
    container `mapped` is read from: an array (for an unnamed Tuple, of as many items as it
    has), else an object."""
    if mapped.shape is Shape.LIST or mapped.positional:
        if not isinstance(value, list):
            return None
        if mapped.shape is Shape.LIST:
            return [(i, item, 0) for i, item in enumerate(value)]
        return (
            [(i, item, i) for i, item in enumerate(value)]
            if len(value) == len(mapped.children)
            else None
        )
    if not isinstance(value, dict):
        return None
    if mapped.shape is Shape.MAP:
        return [(key, item, 1) for key, item in value.items()]
    return [(f.name, value.get(f.name), i) for i, f in enumerate(mapped.arrow)]


@dataclass(frozen=True)
class _Misfit:
    """A value its column does not take: `found`, at `at` (steps from the message's root),
    where `expected` (a ClickHouse type, or the container a path goes through) was. `convert`:
    `found` is a kind of value the type is read from, yet it does not convert."""

    at: Steps
    expected: str
    found: object
    convert: bool = False

    def text(self, where: str = "") -> str:
        """What is wrong, `where` (" at /x", or nothing) after the value or the type."""
        shown = json_shown(self.found)
        if self.convert:
            return f"cannot convert {shown}{where} to {self.expected}"
        return f"expected {self.expected}{where}, got {_json_kind(self.found)} {shown}"


def _json_kind(value: object) -> str:
    """The JSON kind of a value parsed by `json`, as Arrow's errors name it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _kinds_read(mapped: ArrowType) -> tuple[str, ...]:
    """The JSON kinds a scalar type is read from."""
    text = mapped.text
    if mapped.check is Check.JSON:
        return ("object",)
    if pa.types.is_boolean(text):
        return ("boolean",)
    if pa.types.is_string(text) or pa.types.is_timestamp(text):
        return ("string",)
    if pa.types.is_decimal(text):
        return ("number", "string")
    return ("number",)


def _pointer(steps: Steps) -> str:
    """`steps` as a JSON Pointer (RFC 6901): `/user/id`, `/items/0/sku`."""
    return "".join("/" + str(s).replace("~", "~0").replace("/", "~1") for s in steps)


def _inner_types(ch_type: str) -> list[str]:
    """The ClickHouse types of `arrow_type(ch_type).children`, in order, bare (`bare_type`)."""
    name, args = split_type(bare_type(ch_type))
    if name == "Nested":
        return [f"Tuple({', '.join(args)})"]
    if name == "Tuple":
        args = [tuple_element(arg)[1] for arg in args]
    return [bare_type(arg) for arg in args]  # Array(T): [T]; Map(K, V): [K, V]


def _json_scalar(value: object, mapped: ArrowType) -> pa.Array:
    """`value` (parsed by `json`) as Arrow's JSON reader reads it into the scalar type
    `mapped.text`: a one-value array. ValueError (or an Arrow error) where the reader fails:
    a kind it does not read into the type, a fraction or an integer out of range for an
    integer type, text its timestamp or decimal parser refuses."""
    text = mapped.text
    kind = _json_kind(value)
    if kind not in _kinds_read(mapped) or (pa.types.is_integer(text) and isinstance(value, float)):
        raise ValueError(f"Arrow reads no JSON {kind} as {text}")
    if pa.types.is_timestamp(text) or pa.types.is_decimal(text):  # Arrow's own text parsers
        document = pa.BufferReader(b'{"v":' + json.dumps(value).encode() + b"}")
        options = pjson.ParseOptions(explicit_schema=pa.schema([("v", text)]))
        read = pjson.read_json(document, read_options=_ONE_THREAD, parse_options=options)
        return read.column(0).combine_chunks()
    if pa.types.is_floating(text) and isinstance(value, int):
        value = float(value)  # as Arrow reads an integer too big for int64: the nearest double
    return pa.array([value], text)


def _object_scalar(value: object, mapped: ArrowType) -> pa.Array:
    """`value` (parsed by `json`) as `object_column` builds it into the scalar type
    `mapped.text`: a one-value array; an error where that fails."""
    return pa.array([text_value(value, mapped)], mapped.text)


def _object_key(key: object, mapped: ArrowType) -> pa.Array:
    """An object's key as `text_value` builds it into the Map key type `mapped` (an integer
    type: by `int`): a one-value array; an error where that fails."""
    return pa.array([int(str(key)) if pa.types.is_integer(mapped.text) else key], mapped.text)


def _parsed_misfit(
    message: dict[str, object], column: ColumnSpec, mapped: ArrowType
) -> _Misfit | None:
    """The first value in `message` that Arrow's JSON reader, reading `column` at its path
    (`parse_schema`), or then `convert_column`, refuses: a value on the path that is not the
    object or array the next step needs, or a value of the column's type that does not fit.
    Arrow reads every item of an array on the path; `convert_column` checks only the value the
    path picks (`at_path`)."""
    spots: list[tuple[Steps, object]] = [((), message)]
    for step in column.steps:
        inner: list[tuple[Steps, object]] = []
        for at, value in spots:
            if value is None:
                continue
            if isinstance(step, str):
                if not isinstance(value, dict):
                    return _Misfit(at, "an object", value)
                inner.append(((*at, step), value.get(step)))
            elif isinstance(value, list):
                inner += [((*at, i), item) for i, item in enumerate(value)]
            else:
                return _Misfit(at, "an array", value)
        spots = inner
    ch_type = bare_type(column.clickhouse_type)
    for at, value in spots:
        found = _value_misfit(value, mapped, ch_type, at, _json_scalar, checks=at == column.steps)
        if found is not None:
            return found
    return None


def _value_misfit(
    value: object, mapped: ArrowType, ch_type: str, at: Steps, read: _ReadScalar, *, checks: bool
) -> _Misfit | None:
    """The first value in `value` (at `at`, of ClickHouse type `ch_type`) that does not fit:
    a container that is not the one `mapped` is read from, a scalar `read` fails on, or, if
    `checks`, one `convert_column` refuses."""
    if value is None:
        return None
    if mapped.shape is Shape.SCALAR:
        return _scalar_misfit(value, mapped, ch_type, at, read, checks=checks)
    items = _items(value, mapped)
    if items is None:
        return _Misfit(at, ch_type, value)
    inner = _inner_types(ch_type)
    for step, item, i in items:
        here = (*at, step)
        found = None
        if mapped.shape is Shape.MAP:
            key_ch = f"{inner[0]} (a Map key)"
            found = _scalar_misfit(
                step, mapped.children[0], key_ch, here, _object_key, checks=checks
            )
        found = found or _value_misfit(
            item, mapped.children[i], inner[i], here, read, checks=checks
        )
        if found is not None:
            return found
    return None


def _scalar_misfit(
    value: object, mapped: ArrowType, ch_type: str, at: Steps, read: _ReadScalar, *, checks: bool
) -> _Misfit | None:
    """A misfit if `read` fails on the scalar `value` or, if `checks`, `convert_column`
    refuses it."""
    try:
        array = read(value, mapped)
    except CONVERSION_ERRORS:
        return _Misfit(at, ch_type, value, convert=_json_kind(value) in _kinds_read(mapped))
    if checks and mapped.converted:
        try:
            convert_array(array, mapped)
        except ValueError:  # _BadValueError, or an Arrow cast error
            return _Misfit(at, ch_type, value)
    return None


def _json_reason(column: ColumnSpec, misfit: _Misfit) -> str:
    """A dead letter's reason for `misfit` in `column`: the column, and the JSON Pointer to the
    value when it lies in the column's value, else to the column's value with " at" where
    the path went wrong."""
    steps = column.steps
    inside = misfit.at[: len(steps)] == steps
    where = "" if inside else f" at {_pointer(misfit.at)}"
    pointer = _pointer(misfit.at if inside else steps)
    return f"column {column.name!r} (JSON {pointer}): {misfit.text(where)}"
