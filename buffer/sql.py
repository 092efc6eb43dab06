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
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field

import duckdb
import pyarrow as pa

from buffer.limits import QueryLimits
from buffer.snapshot import Snapshot
from buffer.table import MemoryTable

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SHARD = re.compile(r"[0-9]{1,9}")
_LEADING_KEYWORD = re.compile(r"\s*(?:FORCE\s+)?([A-Za-z]+)\b", re.IGNORECASE)
# Rows per Arrow batch: one DuckDB vector, so bytes are counted as each vector comes out.
_BATCH_ROWS = 2048

# Applied when the database is opened, then locked: a query cannot change them back.
_SANDBOX = {
    "enable_external_access": False,  # no files, URLs, ATTACH, COPY, INSTALL
    "allow_community_extensions": False,
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
    "python_enable_replacements": False,  # no scans of the caller's Python variables
}


SHARD = "shard"
"""The query parameter (HTTP `?shard=N`, the Flight header `buffer.client.SHARD_HEADER`)
that restricts a query to one shard's tables."""

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


class ResultTooLargeError(QueryError):
    """The result, as Arrow or encoded, passed ``max_result_bytes``; nothing is returned."""

    kind = "result_too_large"
    http_status = 413


class QueryMemoryError(QueryError):
    """The query needed more than the engine's memory (and spill space, if any)."""

    kind = "memory_limit"
    http_status = 400


SHARD_COLUMN = "_shard"
"""The column every table has in queries: the shard its rows belong to (never stored)."""


@dataclass(frozen=True)
class TableView:
    """One name as queries see it: snapshots of the tables of that name, one per shard, as
    one table whose ``SHARD_COLUMN`` says which shard each row is of."""

    name: str
    shards: Mapping[int, Snapshot]

    @property
    def schema(self) -> pa.Schema:
        first = next(iter(self.shards.values()))
        return first.schema.append(pa.field(SHARD_COLUMN, pa.int32(), nullable=False))

    @property
    def rows(self) -> int:
        return sum(s.rows for s in self.shards.values())

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.shards.values())

    def register(self, cursor: duckdb.DuckDBPyConnection) -> None:
        """Make the view queryable as ``name`` on ``cursor`` (for that connection only):
        each shard's snapshot under an internal name that no plain identifier can take, and
        ``name`` a view over their union."""
        parts = []
        for shard, snap in sorted(self.shards.items()):
            internal = f"{self.name}#{shard}"
            cursor.register(internal, snap.to_table())
            parts.append(f'SELECT *, {shard}::INTEGER AS {SHARD_COLUMN} FROM "{internal}"')
        union = " UNION ALL BY NAME ".join(parts)
        cursor.execute(f'CREATE TEMP VIEW "{self.name}" AS {union}')


@dataclass
class Catalog:
    """The memory tables that queries can see: per name (a pipeline), one table per shard.

    A query sees each name once, over the tables of every shard held (or of the shard it
    asks for), with a ``SHARD_COLUMN`` column; standalone tables are shard 0's.
    """

    _tables: dict[str, dict[int, MemoryTable]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, table: MemoryTable, shard: int = 0) -> None:
        """Make ``table`` queryable under its name (an SQL identifier) as shard ``shard``'s
        part of it; ValueError if that shard's part is already served."""
        if not _NAME.fullmatch(table.name):
            raise ValueError(f"table name {table.name!r} is not a plain SQL identifier")
        if SHARD_COLUMN in table.schema.names:
            raise ValueError(
                f"table {table.name!r} has a column {SHARD_COLUMN!r}, which queries add"
            )
        with self._lock:
            held = self._tables.setdefault(table.name, {})
            if shard in held:
                raise ValueError(
                    f"a table named {table.name!r} of shard {shard} is already in the catalog"
                )
            held[shard] = table

    def discard(self, table: MemoryTable) -> None:
        """Stop serving ``table`` (a no-op if not served)."""
        with self._lock:
            held = self._tables.get(table.name, {})
            for shard in [s for s, t in held.items() if t is table]:
                del held[shard]
            if not held:
                self._tables.pop(table.name, None)

    def names(self) -> list[str]:
        """The names served, sorted."""
        with self._lock:
            return sorted(self._tables)

    def views(self, shard: int | None = None) -> list[TableView]:
        """A view of every name (of only ``shard``'s tables when given; names without one
        of that shard are left out), with fresh snapshots, sorted by name."""
        with self._lock:
            chosen = {
                name: {s: t for s, t in held.items() if shard is None or s == shard}
                for name, held in sorted(self._tables.items())
            }
        return [
            TableView(name, {s: t.snapshot() for s, t in sorted(tables.items())})
            for name, tables in chosen.items()
            if tables
        ]


def shard_of(params: Mapping[str, str]) -> int | None:
    """The shard a query's parameters restrict it to (``buffer.client.SHARD``), or None;
    QueryError naming the value when it is not a shard number."""
    given = params.get(SHARD)
    if given is None:
        return None
    if not _SHARD.fullmatch(given):
        raise QueryError(f"parameter {SHARD}={given!r} is not a shard number")
    return int(given)


class QueryResult:
    """One query's answer as it streams out, held to the engine's limits until it is sent.

    Iterating yields the record batches; before handing one out it counts its rows against
    ``max_rows`` and its Arrow bytes against ``max_result_bytes``, and checks the deadline.
    Whoever encodes the answer reports each encoded chunk to ``encoded``, counted against
    ``max_result_bytes`` and the same deadline, so the timeout covers encoding too. A limit
    passed raises its QueryError at once: what was produced so far is dropped.
    """

    def __init__(
        self,
        schema: pa.Schema,
        batches: Iterable[pa.RecordBatch],
        limits: QueryLimits,
        deadline: float,
    ) -> None:
        self.schema = schema
        self.limits = limits
        self._batches = batches
        self._deadline = deadline
        self._rows = 0
        self._produced = 0
        self._encoded = 0

    @classmethod
    def of_table(cls, table: pa.Table, limits: QueryLimits) -> QueryResult:
        """An answer already in memory (e.g. forwarded), its deadline ``limits.timeout_s``
        from now."""
        return cls(table.schema, table.to_batches(), limits, time.monotonic() + limits.timeout_s)

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        batches = iter(self._batches)
        while True:
            with _engine_errors(self.limits, self._deadline):
                batch = next(batches, None)
            if batch is None:
                return
            self._rows += batch.num_rows
            if self._rows > self.limits.max_rows:
                raise RowLimitError(
                    f"result has more than {self.limits.max_rows} rows (the row limit); "
                    "add a LIMIT or aggregate"
                )
            self._produced += batch.nbytes
            self._check(self._produced, "as Arrow batches")
            yield batch

    def encoded(self, nbytes: int) -> None:
        """Count ``nbytes`` more of the encoded answer; raise past a limit or the deadline."""
        self._encoded += nbytes
        self._check(self._encoded, "encoded")

    def read_all(self) -> pa.Table:
        """The whole result as one table."""
        return pa.Table.from_batches(list(self), schema=self.schema)

    def _check(self, nbytes: int, counted: str) -> None:
        if nbytes > self.limits.max_result_bytes:
            raise ResultTooLargeError(
                f"result is over max_result_bytes ({self.limits.max_result_bytes} bytes, "
                f"counted {counted}); add a LIMIT, select fewer columns or aggregate"
            )
        if time.monotonic() >= self._deadline:
            raise _timeout(self.limits)


class SqlEngine:
    """Runs one read-only SELECT at a time per call, over fresh snapshots of the catalog.

    Thread-safe: every query gets its own DuckDB connection (a cursor on one locked-down
    in-memory database) with the catalog's snapshots registered as Arrow tables, zero-copy,
    behind one temporary view per name (``TableView``).
    DuckDB runs with ``limits.threads`` threads and ``limits.memory_bytes`` of memory; it
    spills to ``limits.spill_dir``, up to ``limits.max_spill_bytes``, only when that is set
    (never to its default ``.tmp`` in the working directory).
    """

    def __init__(self, catalog: Catalog, limits: QueryLimits | None = None) -> None:
        self.catalog = catalog
        self.limits = limits or QueryLimits()
        spill = self.limits.max_spill_bytes > 0
        config: dict[str, str | bool | int | float | list[str]] = {
            **_SANDBOX,
            "memory_limit": f"{self.limits.memory_bytes}B",
            "threads": self.limits.threads,
            "temp_directory": self.limits.spill_dir if spill else "",
            "lock_configuration": True,
        }
        if spill:
            config["max_temp_directory_size"] = f"{self.limits.max_spill_bytes}B"
        self._db = duckdb.connect(":memory:", config=config)

    def close(self) -> None:
        """Release the database; later queries fail."""
        self._db.close()

    def query(self, sql: str, shard: int | None = None) -> pa.Table:
        """The whole result of the single SELECT statement ``sql`` (see ``stream``)."""
        with self.stream(sql, shard) as result:
            return result.read_all()

    @contextmanager
    def stream(self, sql: str, shard: int | None = None) -> Iterator[QueryResult]:
        """The result of the single SELECT statement ``sql``, streamed while in the block.

        Each name of the catalog is one table over the tables of every shard it holds, or
        of ``shard`` only when given (a name without a table of that shard does not exist
        then), with a ``SHARD_COLUMN`` column.

        Raises QueryRefusedError for anything but one SELECT and for sandbox violations
        (files, URLs, extensions, settings), QueryTimeoutError past ``limits.timeout_s``
        (the clock runs until the block ends), RowLimitError past ``limits.max_rows`` and
        ResultTooLargeError past ``limits.max_result_bytes`` (errors, never a silent
        truncation), QueryMemoryError past the engine's memory (and spill space), and
        QueryError with DuckDB's message for anything else: at the start or while the
        result is read and encoded.
        """
        check_read_only(sql)
        with self._stream(sql, shard) as result:
            yield result

    def _execute(self, sql: str) -> pa.Table:
        """``query`` without the statement guard: only DuckDB's locked settings stand.

        Tests call it to prove that second layer holds on its own.
        """
        with self._stream(sql, None) as result:
            return result.read_all()

    @contextmanager
    def _stream(self, sql: str, shard: int | None) -> Iterator[QueryResult]:
        deadline = time.monotonic() + self.limits.timeout_s
        cursor = self._db.cursor()
        # Stops DuckDB's work; a result being encoded stops at its next deadline check.
        timer = threading.Timer(self.limits.timeout_s, cursor.interrupt)
        try:
            with _engine_errors(self.limits, deadline):
                for view in self.catalog.views(shard):
                    view.register(cursor)
                timer.start()
                reader = cursor.sql(sql).to_arrow_reader(batch_size=_BATCH_ROWS)
            assert reader is not None  # a SELECT always has a result
            yield QueryResult(reader.schema, reader, self.limits, deadline)
        finally:
            timer.cancel()
            cursor.close()


def _timeout(limits: QueryLimits) -> QueryTimeoutError:
    return QueryTimeoutError(f"query interrupted after the {limits.timeout_s} s timeout")


@contextmanager
def _engine_errors(limits: QueryLimits, deadline: float) -> Iterator[None]:
    """DuckDB's errors as QueryErrors. Errors met while streaming the result surface as
    Arrow/OS errors, not duckdb's, so those are read by their text."""
    try:
        yield
    except (duckdb.Error, pa.ArrowException, OSError) as exc:
        if time.monotonic() >= deadline:
            raise _timeout(limits) from exc
        if isinstance(exc, duckdb.PermissionException):
            raise QueryRefusedError(f"refused by the sandbox: {exc}") from exc
        text = str(exc)
        if isinstance(exc, duckdb.OutOfMemoryException) or text.startswith("Out of Memory"):
            spill = (
                f"max_spill_bytes ({limits.max_spill_bytes} bytes) of spill space"
                if limits.max_spill_bytes
                else "no spilling to disk"
            )
            # DuckDB's first line says what ran out; its advice (SET ...) does not apply here.
            raise QueryMemoryError(
                f"query needs more than the engine's memory_bytes ({limits.memory_bytes} "
                f"bytes) with {spill}: {text.splitlines()[0]}"
            ) from exc
        raise QueryError(text) from exc


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
