"""Target and dead-letter tables: DDL from a `TableSpec`, creation if missing, schema checks."""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client


class Engine(StrEnum):
    MERGE_TREE = "MergeTree"
    REPLICATED_MERGE_TREE = "ReplicatedMergeTree"


DEFAULT_DEDUP_WINDOW = 10_000


def quote_identifier(name: str) -> str:
    """`name` as a ClickHouse identifier in backquotes."""
    return "`" + name.replace("\\", "\\\\").replace("`", "\\`") + "`"


@dataclass(frozen=True)
class TableSpec:
    """One table as the pipeline wants it; `columns` are ordered ``(name, clickhouse_type)``.

    `order_by`, `partition_by` and `ttl` are ClickHouse expressions copied into the DDL.
    `dedup_window` is the number of recent insert blocks whose tokens ClickHouse remembers; it
    must exceed the number of blocks that can be in doubt (re-flushed) at any time.
    """

    database: str
    table: str
    columns: tuple[tuple[str, str], ...]
    order_by: str = "tuple()"
    partition_by: str | None = None
    ttl: str | None = None
    engine: Engine = Engine.MERGE_TREE
    zookeeper_path: str = "/clickhouse/tables/{shard}/{database}/{table}"
    replica_name: str = "{replica}"
    dedup_window: int = DEFAULT_DEDUP_WINDOW

    def __post_init__(self) -> None:
        if not self.columns:
            raise ValueError(f"table {self.qualified_name}: no columns")
        names = [name for name, _ in self.columns]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"table {self.qualified_name}: duplicate columns {duplicates}")
        if self.dedup_window < 1:
            raise ValueError(f"table {self.qualified_name}: dedup_window must be >= 1")

    @property
    def qualified_name(self) -> str:
        return f"{quote_identifier(self.database)}.{quote_identifier(self.table)}"

    def create_sql(self) -> str:
        """The ``CREATE TABLE IF NOT EXISTS`` statement for this spec."""
        columns = ",\n  ".join(f"{quote_identifier(n)} {t}" for n, t in self.columns)
        if self.engine is Engine.REPLICATED_MERGE_TREE:
            engine = f"ReplicatedMergeTree('{self.zookeeper_path}', '{self.replica_name}')"
            window = "replicated_deduplication_window"
        else:
            engine = "MergeTree"
            window = "non_replicated_deduplication_window"
        parts = [f"CREATE TABLE IF NOT EXISTS {self.qualified_name} (\n  {columns}\n)"]
        parts.append(f"ENGINE = {engine}")
        if self.partition_by:
            parts.append(f"PARTITION BY {self.partition_by}")
        parts.append(f"ORDER BY {self.order_by}")
        if self.ttl:
            parts.append(f"TTL {self.ttl}")
        parts.append(f"SETTINGS {window} = {self.dedup_window}")
        return "\n".join(parts)


class SchemaMismatchError(Exception):
    """An existing table's columns differ from the spec; the message names every difference."""

    def __init__(
        self,
        table: str,
        missing: list[str],
        extra: list[str],
        retyped: list[tuple[str, str, str]],
    ) -> None:
        self.table = table
        self.missing = missing
        self.extra = extra
        self.retyped = retyped
        problems = []
        if missing:
            problems.append(f"missing columns {missing}")
        if extra:
            problems.append(f"unexpected columns {extra}")
        if retyped:
            changes = ", ".join(
                f"{n}: table has {had}, spec wants {want}" for n, had, want in retyped
            )
            problems.append(f"retyped columns [{changes}]")
        super().__init__(f"table {table} differs from the pipeline schema: " + "; ".join(problems))


_SPACE_OUTSIDE_QUOTES = re.compile(r"'(?:[^'\\]|\\.)*'|\s+")


def normalize_type(type_name: str) -> str:
    """`type_name` without whitespace outside string literals (ClickHouse adds ', ')."""
    return _SPACE_OUTSIDE_QUOTES.sub(
        lambda m: m.group(0) if m.group(0)[0] == "'" else "", type_name
    )


def table_columns(client: Client, database: str, table: str) -> list[tuple[str, str]] | None:
    """The table's ``(name, type)`` pairs in order, or None if it does not exist."""
    rows = client.query(
        "SELECT name, type FROM system.columns WHERE database = {db:String} AND table = {t:String}"
        " ORDER BY position",
        parameters={"db": database, "t": table},
    ).result_rows
    if not rows:  # every table has a column: no rows means no table
        return None
    return [(str(name), str(type_)) for name, type_ in rows]


def compare_columns(spec: TableSpec, actual: list[tuple[str, str]]) -> SchemaMismatchError | None:
    """The differences between `spec` and a table's `actual` columns (order is not compared)."""
    wanted = dict(spec.columns)
    have = dict(actual)
    missing = [name for name, _ in spec.columns if name not in have]
    extra = [name for name, _ in actual if name not in wanted]
    retyped = [
        (name, have[name], type_)
        for name, type_ in spec.columns
        if name in have and normalize_type(have[name]) != normalize_type(type_)
    ]
    if missing or extra or retyped:
        return SchemaMismatchError(f"{spec.database}.{spec.table}", missing, extra, retyped)
    return None


def ensure_table(client: Client, spec: TableSpec) -> bool:
    """Create the table if missing (True) or check an existing one's columns (False).

    Raises `SchemaMismatchError` naming the missing, unexpected and retyped columns.
    """
    actual = table_columns(client, spec.database, spec.table)
    if actual is None:
        client.command(spec.create_sql())
        return True
    mismatch = compare_columns(spec, actual)
    if mismatch is not None:
        raise mismatch
    return False
