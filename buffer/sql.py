"""Read-only, sandboxed SQL (DuckDB) over snapshots of named memory tables.

Two layers: ``check_read_only`` lets only a single SELECT through, and the database is
opened with file, URL and extension access off and its configuration locked. The second
layer does not stop writes to the shared in-memory database: CREATE TABLE / VIEW / MACRO,
INSERT, DROP, ATTACH ':memory:', USE, SET VARIABLE, CHECKPOINT and LOAD of an extension
built into DuckDB (json, parquet) all pass it, and a table one query creates outlives it
(memory held from every later query, names seen by other users). Only the statement guard
refuses those, so every query must go through it.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import duckdb
import pyarrow as pa

from buffer.snapshot import Snapshot
from buffer.table import MemoryTable

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_LEADING_KEYWORD = re.compile(r"\s*(?:FORCE\s+)?([A-Za-z]+)\b", re.IGNORECASE)

# Applied when the database is opened, then locked: a query cannot change them back.
_SANDBOX = {
    "enable_external_access": False,  # no files, URLs, ATTACH, COPY, INSTALL
    "allow_community_extensions": False,
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
    "python_enable_replacements": False,  # no scans of the caller's Python variables
}


Forward = Callable[[str, Mapping[str, str]], pa.Table | None]
"""Given the SQL and the request parameters, run the query elsewhere and return its result,
or return None to answer it here (e.g. a follower forwarding to the shard's leader). The
HTTP and Flight services call it before their own engine."""


class QueryError(Exception):
    """The query failed; the message is the engine's (or ours) and safe to show the user."""

    kind = "query_error"
    http_status = 400


class QueryRefusedError(QueryError):
    """The query tried something the sandbox forbids (writes, files, URLs, extensions...)."""

    kind = "refused"
    http_status = 403


class QueryTimeoutError(QueryError):
    """The query ran past the engine's per-query timeout and was interrupted."""

    kind = "timeout"
    http_status = 408


class RowLimitError(QueryError):
    """The result has more rows than the engine's row limit; nothing is returned."""

    kind = "row_limit"
    http_status = 400


@dataclass
class Catalog:
    """The memory tables that queries can see, by pipeline name."""

    _tables: dict[str, MemoryTable] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, table: MemoryTable) -> None:
        """Make ``table`` queryable under its name (an SQL identifier, unique here)."""
        if not _NAME.fullmatch(table.name):
            raise ValueError(f"table name {table.name!r} is not a plain SQL identifier")
        with self._lock:
            if table.name in self._tables:
                raise ValueError(f"a table named {table.name!r} is already in the catalog")
            self._tables[table.name] = table

    def remove(self, name: str) -> None:
        """Stop serving the table ``name``."""
        with self._lock:
            del self._tables[name]

    def discard(self, table: MemoryTable) -> None:
        """Stop serving ``table`` under whatever name it has now (a no-op if not served)."""
        with self._lock:
            if self._tables.get(table.name) is table:
                del self._tables[table.name]

    def names(self) -> list[str]:
        """The names served, sorted."""
        with self._lock:
            return sorted(self._tables)

    def rename(self, old: str, new: str) -> bool:
        """Serve the table ``old`` as ``new`` from now on; False if ``old`` is not served or
        ``new`` is taken."""
        if not _NAME.fullmatch(new):
            raise ValueError(f"table name {new!r} is not a plain SQL identifier")
        with self._lock:
            if old not in self._tables or new in self._tables:
                return False
            table = self._tables.pop(old)
            table.name = new
            self._tables[new] = table
            return True

    def snapshots(self) -> list[Snapshot]:
        """A snapshot of every table, sorted by name."""
        with self._lock:
            tables = sorted(self._tables.values(), key=lambda t: t.name)
        return [t.snapshot() for t in tables]


@dataclass(frozen=True)
class QueryLimits:
    """Per-query bounds: wall-clock timeout, result rows and DuckDB memory for the engine."""

    timeout_s: float = 10.0
    max_rows: int = 1_000_000
    memory_limit: str = "1GB"
    threads: int = 2


class SqlEngine:
    """Runs one read-only SELECT at a time per call, over fresh snapshots of the catalog.

    Thread-safe: every query gets its own DuckDB connection (a cursor on one locked-down
    in-memory database) with the catalog's snapshots registered as Arrow tables, zero-copy.
    """

    def __init__(self, catalog: Catalog, limits: QueryLimits | None = None) -> None:
        self.catalog = catalog
        self.limits = limits or QueryLimits()
        config: dict[str, str | bool | int | float | list[str]] = {
            **_SANDBOX,
            "memory_limit": self.limits.memory_limit,
            "threads": self.limits.threads,
            "lock_configuration": True,
        }
        self._db = duckdb.connect(":memory:", config=config)

    def close(self) -> None:
        """Release the database; later queries fail."""
        self._db.close()

    def query(self, sql: str) -> pa.Table:
        """The result of the single SELECT statement ``sql``.

        Raises QueryRefusedError for anything but one SELECT and for sandbox violations
        (files, URLs, extensions, settings), QueryTimeoutError past ``limits.timeout_s``,
        RowLimitError when the result exceeds ``limits.max_rows`` (an error, never a
        silent truncation), QueryError with DuckDB's message for anything else.
        """
        check_read_only(sql)
        return self._execute(sql)

    def _execute(self, sql: str) -> pa.Table:
        """``query`` without the statement guard: only DuckDB's locked settings stand.

        Tests call it to prove that second layer holds on its own.
        """
        cursor = self._db.cursor()
        timed_out = threading.Event()

        def interrupt() -> None:
            timed_out.set()
            cursor.interrupt()

        timer = threading.Timer(self.limits.timeout_s, interrupt)
        try:
            for snap in self.catalog.snapshots():
                cursor.register(snap.name, snap.to_table())
            timer.start()
            reader = cursor.sql(sql).to_arrow_reader(batch_size=65_536)
            assert reader is not None  # a SELECT always has a result
            batches: list[pa.RecordBatch] = []
            rows = 0
            for batch in reader:
                rows += batch.num_rows
                if rows > self.limits.max_rows:
                    raise RowLimitError(
                        f"result has more than {self.limits.max_rows} rows (the row limit); "
                        "add a LIMIT or aggregate"
                    )
                batches.append(batch)
            return pa.Table.from_batches(batches, schema=reader.schema)
        except (duckdb.Error, pa.ArrowException, OSError) as exc:
            # Errors met while streaming the result surface as Arrow/OS errors, not duckdb's.
            if timed_out.is_set():
                raise QueryTimeoutError(
                    f"query interrupted after the {self.limits.timeout_s} s timeout"
                ) from exc
            if isinstance(exc, duckdb.PermissionException):
                raise QueryRefusedError(f"refused by the sandbox: {exc}") from exc
            raise QueryError(str(exc)) from exc
        finally:
            timer.cancel()
            cursor.close()


def check_read_only(sql: str) -> None:
    """Raise QueryRefusedError unless ``sql`` is one SELECT; QueryError if it does not parse.

    The refusal names the statement as written (INSTALL, RESET...), not DuckDB's type for it.
    """
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as exc:
        raise QueryError(str(exc)) from exc
    if len(statements) != 1:
        raise QueryRefusedError(f"exactly one statement is allowed, got {len(statements)}")
    statement = statements[0]
    try:
        kind: duckdb.StatementType | None = statement.type
    except ValueError:  # a type the binding's enum lacks (UPDATE EXTENSIONS): not a SELECT
        kind = None
    if kind != duckdb.StatementType.SELECT:
        raise QueryRefusedError(
            f"only SELECT queries are allowed; {_statement_name(statement.query, kind)} "
            "statements are refused (no COPY, ATTACH, INSTALL, LOAD, SET, PRAGMA or writes)"
        )


def _statement_name(query: str, kind: duckdb.StatementType | None) -> str:
    """The leading keyword of ``query`` (after FORCE), else ``kind``'s name.

    DuckDB files INSTALL under LOAD, RESET and USE under SET, CHECKPOINT under CALL...;
    a refusal naming the type would name a statement the user never wrote.
    """
    lead = _LEADING_KEYWORD.match(query)
    if lead is not None and lead[1].upper() != "WITH":  # WITH ... INSERT: the type says more
        return lead[1].upper()
    return kind.name if kind is not None else "UNKNOWN"
