"""How a bad message's reason shows what is wrong: a value (as Python or as JSON writes it,
cut short) and a column's ClickHouse type (without the Nullable and LowCardinality around
it)."""

from __future__ import annotations

import json

from chlib.chtypes import split_type

_SHOWN = 64  # characters of a bad value quoted in its error


def shown(value: object) -> str:
    """`value` as Python prints it, cut to `_SHOWN` characters."""
    return _clipped(repr(value))


def json_shown(value: object) -> str:
    """`value` (a JSON value, or a CSV field) as JSON writes it, cut to `_SHOWN` characters."""
    return _clipped(json.dumps(value, ensure_ascii=False))


def _clipped(text: str) -> str:
    """`text`, or its first `_SHOWN` - 3 characters and "..." if it is longer."""
    return text if len(text) <= _SHOWN else text[: _SHOWN - 3] + "..."


def bare_type(ch_type: str) -> str:
    """`ch_type` without the Nullable and LowCardinality around it."""
    name, args = split_type(ch_type)
    return bare_type(args[0]) if name in ("Nullable", "LowCardinality") else ch_type.strip()
