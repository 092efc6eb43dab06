"""ClickHouse type text: split into name and arguments, and the type a reader casts a column to
so that ClickHouse's Arrow output holds text where it would hold codes.

ClickHouse writes UUID as 16 bytes, IPv4 as a number, IPv6 as 16 bytes, an Enum as its
number and JSON as an extension type Spark cannot take; `text_type` rewrites those (at any
depth of Array, Map, Tuple, Nested, Nullable, LowCardinality) to String, which ClickHouse
casts to the canonical text: the form hakafka decodes them to.
"""

from __future__ import annotations

import re

# Types whose Arrow output is not their text form, and whose CAST to String is.
_TEXT_LEAVES = frozenset({"UUID", "IPv4", "IPv6", "Enum8", "Enum16", "JSON"})
_WRAPPERS = frozenset({"Nullable", "LowCardinality", "Array", "Map"})
_NAMED_ELEMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)\s+(\S.*)$", re.DOTALL)


def split_type(ch_type: str) -> tuple[str, list[str]]:
    """`Name(arg1, arg2(x, y))` -> (`Name`, [`arg1`, `arg2(x, y)`]): commas split at the top
    level, outside quotes; ValueError for unbalanced parentheses or quotes."""
    text = ch_type.strip()
    if "(" not in text:
        return text, []
    if not text.endswith(")"):
        raise ValueError("unbalanced parentheses")
    return text[: text.index("(")].strip(), split_top_level(text[text.index("(") + 1 : -1], ",")


def split_top_level(text: str, separator: str) -> list[str]:
    """`text` split at each `separator` that stands outside parentheses and quotes, each part
    stripped; ValueError for unbalanced parentheses or quotes."""
    parts: list[str] = []
    depth, start, quote, escaped = 0, 0, "", False
    for i, char in enumerate(text):
        if quote:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == quote:
                quote = ""
        elif char in "'`\"":
            quote = char
        elif char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
            if depth < 0:
                raise ValueError("unbalanced parentheses")
        elif depth == 0 and i >= start and text.startswith(separator, i):
            parts.append(text[start:i].strip())
            start = i + len(separator)
    if depth != 0 or quote:
        raise ValueError("unbalanced parentheses or quotes")
    parts.append(text[start:].strip())
    return parts


def tuple_element(arg: str) -> tuple[str | None, str]:
    """A Tuple or Nested element: (`name`, `type`) for ``name Type``, (None, `type`) for an
    unnamed one."""
    found = _NAMED_ELEMENT.match(arg.strip())
    if found is None or "(" in found.group(1):
        return None, arg.strip()
    return found.group(1), found.group(2).strip()


def text_type(ch_type: str) -> str:
    """`ch_type` with UUID, IPv4, IPv6, Enum8/16 and JSON made String, at any depth (a Nested
    column becomes the Array of Tuples it is); `ch_type` itself if it holds none."""
    name, args = split_type(ch_type)
    if name in _TEXT_LEAVES:
        return "String"
    if name in _WRAPPERS:
        return f"{name}({', '.join(text_type(a) for a in args)})"
    if name in ("Tuple", "Nested"):
        elements = []
        for arg in args:
            element, inner = tuple_element(arg)
            mapped = text_type(inner)
            elements.append(mapped if element is None else f"{element} {mapped}")
        made = f"Tuple({', '.join(elements)})"
        return made if name == "Tuple" else f"Array({made})"
    return ch_type


def canonical_type(ch_type: str) -> str:
    """`ch_type` with its Enum elements in the order ClickHouse prints them (by value), at any
    depth, so a declared type compares equal to the one the server reports."""
    name, args = split_type(ch_type)
    if not args:
        return ch_type.strip()
    if name in ("Enum8", "Enum16"):
        args = sorted(args, key=lambda arg: int(arg.rpartition("=")[2]))
    else:
        args = [canonical_type(arg) for arg in args]
    return f"{name}({', '.join(args)})"


def needs_text_cast(ch_type: str) -> bool:
    """True if ClickHouse's Arrow output of `ch_type` differs from its text form."""
    return text_type(ch_type) != ch_type
