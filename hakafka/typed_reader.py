"""Typed reads of the tables of a parsed document (TOML, JSON): `TypedReader`.

Each value comes back as the kind asked for, or as the default with a problem recorded under
its full key (`pipelines[0].buffer.max_rows: must be an integer, got a string 'x'`), so one
pass reports every problem of a document. How a problem is worded and what becomes of it
belong to the document's reader: a subclass words `missing` and `wrong_type` its own way and
may make `problem` raise (a znode record is corrupt at its first bad field:
`hakafka.coordination.records`; the config lists them all: `hakafka.config.reader`).

Nothing of hakafka is imported here: the config and the coordination layer both use it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from enum import StrEnum
from typing import Any, Self, TypeVar

T = TypeVar("T")
E = TypeVar("E", bound=StrEnum)

Check = Callable[[Any], str | None]
"""An extra rule for a value of the right kind: a problem text, or None when it holds."""


class TypedReader:
    """Reads one table of a document, recording problems with full key paths instead of
    raising. Its nested tables (`table`) are read by the same class into the same problems."""

    def __init__(
        self, data: Mapping[str, Any], path: str = "", problems: list[str] | None = None
    ) -> None:
        self.data = data
        self.path = path
        self.problems: list[str] = [] if problems is None else problems
        self.seen: set[str] = set()

    def key(self, name: str) -> str:
        """The full key of `name` in the document (`zookeeper.hosts`)."""
        return f"{self.path}.{name}" if self.path else name

    def problem(self, name: str, text: str) -> None:
        """Record `text` as what is wrong with key `name`."""
        self.problems.append(f"{self.key(name)}: {text}")

    def missing(self, name: str) -> str:
        """The problem text for key `name`, required but absent."""
        return "is required"

    def wrong_type(self, name: str, value: Any, kinds: tuple[type, ...], secret: bool) -> str:
        """The problem text for key `name` holding `value`, of none of `kinds`; a `secret`
        value is not quoted."""
        names = " or ".join(_type_name(k) for k in kinds)
        shown = "" if secret else f" {value!r}"
        return f"must be {names}, got {_type_name(type(value))}{shown}"

    def get(
        self,
        name: str,
        kind: type[T] | tuple[type, ...],
        default: T | None = None,
        *,
        required: bool = False,
        check: Check | None = None,
        secret: bool = False,
        type_problem: str = "",
    ) -> T:
        """The value of key `name` as `kind`, or `default` with a problem recorded (absent
        and `required`, of another kind, or refused by `check`). `type_problem` replaces
        `wrong_type`'s text; a `secret` value is never quoted in a problem."""
        self.seen.add(name)
        if name not in self.data:
            if required:
                self.problem(name, self.missing(name))
            return default  # type: ignore[return-value]
        value = self.data[name]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        # Integers are acceptable where a float is wanted; bools are never numbers.
        if float in kinds and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            self.problem(name, type_problem or self.wrong_type(name, value, kinds, secret))
            return default  # type: ignore[return-value]
        if check is not None and (text := check(value)) is not None:
            self.problem(name, text)
            return default  # type: ignore[return-value]
        return value  # type: ignore[return-value]

    def optional(self, name: str, kind: type[T], default: T, *, type_problem: str = "") -> T:
        """Like `get`, but a null value reads as absent: `default` (JSON written before the key
        existed, or by a writer with nothing to say there)."""
        if self.data.get(name) is None:
            self.seen.add(name)
            return default
        return self.get(name, kind, default, type_problem=type_problem)

    def choice(self, name: str, kind: type[E], default: E) -> E:
        """One of the values of the enum `kind`, as its member."""
        allowed = [member.value for member in kind]
        value = self.get(
            name,
            str,
            default.value,
            check=lambda v: (
                None if v in allowed else f"must be one of {', '.join(allowed)}; got {v!r}"
            ),
        )
        return kind(value)

    def table(self, name: str, *, required: bool = False) -> Self:
        """The table at key `name` ({} when absent or not a table, with the problem
        recorded), read by this reader's class."""
        raw = self.get(name, dict, {}, required=required)
        return type(self)(raw if isinstance(raw, dict) else {}, self.key(name), self.problems)

    def finish(self) -> None:
        """Record every key that no read asked for as unknown."""
        for name in sorted(set(self.data) - self.seen):
            self.problem(name, "unknown key")


def _type_name(kind: type) -> str:
    return {
        str: "a string",
        int: "an integer",
        float: "a number",
        bool: "true or false",
        dict: "a table",
        list: "an array",
    }.get(kind, kind.__name__)
