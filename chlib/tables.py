"""Target and dead-letter tables: DDL from a `TableSpec`, creation if missing, schema checks,
and the checks that an existing table deduplicates retried inserts (`UnsafeTableError`).

Exactly-once rests on ClickHouse dropping an insert block whose `insert_deduplication_token`
it has seen among the last N blocks of the table. An existing table is accepted when:

- its engine is of the MergeTree family (``MergeTree``, ``ReplacingMergeTree``,
  ``SummingMergeTree``, ... and their ``Replicated``/``Shared`` forms): insert deduplication
  belongs to the MergeTree storage, whatever the engine later merges; any other engine
  (``Log``, ``Distributed``, a view, ...) deduplicates nothing;
- it is replicated exactly when the spec's `Engine` is (a non-replicated table keeps its
  token log on one server, so a re-flush to another replica of the shard inserts again);
- a non-replicated table is the same table behind every endpoint of the shard: a shard may
  name one server at several addresses (a proxy or load balancer per node), but two servers
  keep two logs; `check_one_table` compares the table's ``system.tables.uuid`` as each
  endpoint shows it (an endpoint string cannot tell one server from two);
- its window (``non_replicated_deduplication_window``, or ``replicated_deduplication_window``
  for a replicated engine), as set on the table or else the server's default, is at least the
  spec's `dedup_window`. A smaller window is refused too, not only 0: the spec's window is the
  number of blocks that may pass between an attempt and its re-flush, and the fix is one
  online ``ALTER TABLE ... MODIFY SETTING``.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

from chlib.chtypes import canonical_type

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client


class Engine(StrEnum):
    MERGE_TREE = "MergeTree"
    REPLICATED_MERGE_TREE = "ReplicatedMergeTree"

    @property
    def window_setting(self) -> str:
        """The table setting holding how many recent insert blocks this engine deduplicates."""
        if self is Engine.REPLICATED_MERGE_TREE:
            return "replicated_deduplication_window"
        return "non_replicated_deduplication_window"


DEFAULT_DEDUP_WINDOW = 10_000
# A Nested column stays one column of that type (an Array of Tuples in Arrow), not one
# Array column per element as the default `flatten_nested = 1` would make it.
CREATE_SETTINGS = {"flatten_nested": 0}


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
        else:
            engine = "MergeTree"
        parts = [f"CREATE TABLE IF NOT EXISTS {self.qualified_name} (\n  {columns}\n)"]
        parts.append(f"ENGINE = {engine}")
        if self.partition_by:
            parts.append(f"PARTITION BY {self.partition_by}")
        parts.append(f"ORDER BY {self.order_by}")
        if self.ttl:
            parts.append(f"TTL {self.ttl}")
        parts.append(f"SETTINGS {self.engine.window_setting} = {self.dedup_window}")
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
    """`type_name` as ClickHouse reports it, for comparing: without whitespace outside
    string literals (ClickHouse adds ', ') and with Enum elements ordered by value."""
    with contextlib.suppress(ValueError):  # malformed: compared as written
        type_name = canonical_type(type_name)
    return _SPACE_OUTSIDE_QUOTES.sub(
        lambda m: m.group(0) if m.group(0)[0] == "'" else "", type_name
    )


def table_columns(client: Client, database: str, table: str) -> list[tuple[str, str]] | None:
    """The ``(name, type)`` pairs of the table's columns an INSERT writes (not MATERIALIZED or
    ALIAS ones), in order; None if the table does not exist."""
    rows = client.query(
        "SELECT name, type, default_kind FROM system.columns"
        " WHERE database = {db:String} AND table = {t:String} ORDER BY position",
        parameters={"db": database, "t": table},
    ).result_rows
    if not rows:  # every table has a column: no rows means no table
        return None
    return [
        (str(name), str(type_))
        for name, type_, kind in rows
        if kind not in ("MATERIALIZED", "ALIAS")
    ]


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


class UnsafeTableError(Exception):
    """An existing table would not drop a re-flushed insert block; the message names the table,
    each problem and its fix."""

    def __init__(self, table: str, problems: list[str]) -> None:
        self.table = table
        self.problems = problems
        super().__init__(
            f"table {table} would not deduplicate re-flushed inserts: " + "; ".join(problems)
        )


@dataclass(frozen=True)
class TableDedup:
    """How an existing table deduplicates inserts, as its server reports it."""

    engine: str
    """The engine's name (``system.tables.engine``), e.g. ``ReplacingMergeTree``."""
    kind: Engine | None
    """Whose deduplication log the engine keeps (one server's, or the replicas' shared one);
    None: not a MergeTree engine, it keeps none."""
    window: int = 0
    window_on_table: bool = False
    """True if the table sets its window; False: the server's default applies."""


def dedup_kind(engine: str) -> Engine | None:
    """The kind of deduplication log `engine` keeps, or None for an engine that keeps none.

    Every MergeTree-family engine deduplicates insert blocks (what it merges later does not
    matter); ``Replicated*`` and ClickHouse Cloud's ``Shared*`` ones keep the log in Keeper.
    """
    if not engine.endswith("MergeTree"):
        return None
    if engine.startswith(("Replicated", "Shared")):
        return Engine.REPLICATED_MERGE_TREE
    return Engine.MERGE_TREE


# A quoted literal or identifier (skipped whole), or the SETTINGS keyword.
_SETTINGS_KEYWORD = re.compile(r"'(?:[^'\\]|\\.)*'|`(?:[^`\\]|\\.)*`|\bSETTINGS\b", re.IGNORECASE)
_SETTING = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*=\s*('(?:[^'\\]|\\.)*'|[^,']*)")


def engine_settings(engine_full: str) -> dict[str, str]:
    """The ``name = value`` pairs of the SETTINGS clause that ends ``system.tables.engine_full``
    (values as written; {} without a clause)."""
    keywords = [
        m.end() for m in _SETTINGS_KEYWORD.finditer(engine_full) if m.group(0)[0] not in "'`"
    ]
    if not keywords:
        return {}
    clause = engine_full[keywords[-1] :]
    return {m.group(1): m.group(2).strip() for m in _SETTING.finditer(clause)}


def table_dedup(client: Client, database: str, table: str) -> TableDedup | None:
    """The table's engine and effective deduplication window, or None if it does not exist.

    The window is the table's own setting (from ``engine_full``), else `default_window`.
    """
    rows = client.query(
        "SELECT engine, engine_full FROM system.tables"
        " WHERE database = {db:String} AND name = {t:String}",
        parameters={"db": database, "t": table},
    ).result_rows
    if not rows:
        return None
    engine, engine_full = str(rows[0][0]), str(rows[0][1])
    kind = dedup_kind(engine)
    if kind is None:
        return TableDedup(engine, None)
    own = engine_settings(engine_full).get(kind.window_setting)
    if own is not None:
        return TableDedup(engine, kind, int(own), window_on_table=True)
    return TableDedup(engine, kind, default_window(client, kind))


def default_window(client: Client, kind: Engine) -> int:
    """The server's deduplication window for a table of `kind` that does not set its own
    (``system.merge_tree_settings``, or ``system.replicated_merge_tree_settings``, which adds
    the server's overrides for replicated tables); 0 if the server lacks the setting."""
    defaults = (
        "system.replicated_merge_tree_settings"
        if kind is Engine.REPLICATED_MERGE_TREE
        else "system.merge_tree_settings"
    )
    rows = client.query(
        f"SELECT value FROM {defaults} WHERE name = {{name:String}}",
        parameters={"name": kind.window_setting},
    ).result_rows
    return int(rows[0][0]) if rows else 0


def check_dedup(spec: TableSpec, dedup: TableDedup) -> UnsafeTableError | None:
    """What keeps the existing table `dedup` from deduplicating `spec`'s re-flushes, each
    problem with its fix; None if nothing does."""
    table = spec.qualified_name
    if dedup.kind is None:
        return UnsafeTableError(
            f"{spec.database}.{spec.table}",
            [
                f"engine {dedup.engine} does not deduplicate inserts (only MergeTree-family "
                f"engines do); fix: rename or drop {table}, then hakafka creates it as "
                f"{spec.engine} with {spec.engine.window_setting} = {spec.dedup_window}"
            ],
        )
    problems = []
    if dedup.kind is not spec.engine and spec.engine is Engine.REPLICATED_MERGE_TREE:
        problems.append(
            f"engine {dedup.engine} is not replicated but the configured engine is "
            f"{spec.engine}: its deduplication log is on one server, so a re-flush to another "
            f"replica inserts the rows again; fix: recreate it as a ReplicatedMergeTree, or "
            f"configure engine = {Engine.MERGE_TREE} with one ClickHouse server per shard"
        )
    elif dedup.kind is not spec.engine:
        problems.append(
            f"engine {dedup.engine} is replicated but the configured engine is {spec.engine}; "
            f"fix: configure engine = {Engine.REPLICATED_MERGE_TREE}"
        )
    if dedup.window < spec.dedup_window:
        setting = dedup.kind.window_setting
        source = "set on the table" if dedup.window_on_table else "the server's default"
        effect = (
            "deduplicates nothing"
            if dedup.window == 0
            else f"is below the configured dedup window {spec.dedup_window}, so a re-flush "
            f"after that many other inserts may insert the rows again"
        )
        problems.append(
            f"{setting} = {dedup.window} ({source}) {effect}; "
            f"fix: ALTER TABLE {table} MODIFY SETTING {setting} = {spec.dedup_window}"
        )
    return UnsafeTableError(f"{spec.database}.{spec.table}", problems) if problems else None


_NO_UUID = "00000000-0000-0000-0000-000000000000"


def table_uuid(client: Client, database: str, table: str) -> str | None:
    """The table's UUID (``system.tables.uuid``), the same through every address of its
    server; None if the table does not exist or its database gives no UUIDs (Ordinary)."""
    rows = client.query(
        "SELECT toString(uuid) FROM system.tables"
        " WHERE database = {db:String} AND name = {t:String}",
        parameters={"db": database, "t": table},
    ).result_rows
    found = str(rows[0][0]) if rows else _NO_UUID
    return None if found == _NO_UUID else found


def check_one_table(spec: TableSpec, uuids: Mapping[str, str | None]) -> UnsafeTableError | None:
    """For a non-replicated `spec`, whether the endpoints in `uuids` (a name for each, e.g.
    ``n1 (10.0.0.1:8123)`` -> the UUID its `table_uuid` gave) all reach one table; None when
    they do, or the spec is replicated (each replica has its own table and a shared log)."""
    if spec.engine is Engine.REPLICATED_MERGE_TREE or len(uuids) < 2:
        return None
    if unknown := sorted(name for name, uuid in uuids.items() if uuid is None):
        problem = (
            f"its database gives no table UUIDs through {', '.join(unknown)}, so hakafka cannot "
            f"tell whether the shard's endpoints {', '.join(sorted(uuids))} reach one server; "
            f"fix: one endpoint per shard, or an Atomic database"
        )
        return UnsafeTableError(f"{spec.database}.{spec.table}", [problem])
    tables: dict[str, list[str]] = {}
    for name, uuid in sorted(uuids.items()):
        tables.setdefault(str(uuid), []).append(name)
    if len(tables) < 2:
        return None
    seen = "; ".join(f"{', '.join(names)}: uuid {uuid}" for uuid, names in tables.items())
    problem = (
        f"engine {spec.engine} keeps its deduplication log per server, and the shard's "
        f"endpoints reach different tables ({seen}), so a re-flush to another of them "
        f"inserts the rows again; fix: engine = {Engine.REPLICATED_MERGE_TREE}, or endpoints "
        f"that all reach one server"
    )
    return UnsafeTableError(f"{spec.database}.{spec.table}", [problem])


def ensure_table(client: Client, spec: TableSpec) -> bool:
    """Create the table if missing (True) or check an existing one (False): its columns, its
    engine and its deduplication window.

    Raises `SchemaMismatchError` naming the missing, unexpected and retyped columns, and
    `UnsafeTableError` naming what would keep a re-flush from being deduplicated, with the fix.
    """
    actual = table_columns(client, spec.database, spec.table)
    if actual is None:
        client.command(spec.create_sql(), settings=CREATE_SETTINGS)
        return True
    mismatch = compare_columns(spec, actual)
    if mismatch is not None:
        raise mismatch
    dedup = table_dedup(client, spec.database, spec.table)
    unsafe = check_dedup(spec, dedup) if dedup is not None else None
    if unsafe is not None:
        raise unsafe
    return False
