"""Sandboxed SQL over snapshots: right rows, every refusal, timeout, row limit, bad SQL."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from buffer import Catalog, MemoryTable, QueryError, QueryLimits, QueryRefusedError, SqlEngine
from buffer.sql import QueryTimeoutError, RowLimitError

_NO_FILES = "file system operations are disabled by configuration"
_LOCKED = "the configuration has been locked"


def test_select_sees_all_buffered_rows(engine: SqlEngine) -> None:
    result = engine.query(
        "SELECT _partition, count(*) AS n, min(_offset) AS lo, max(_offset) AS hi "
        "FROM events GROUP BY _partition ORDER BY _partition"
    )
    assert result.to_pylist() == [
        {"_partition": 0, "n": 1000, "lo": 0, "hi": 999},
        {"_partition": 1, "n": 500, "lo": 0, "hi": 499},
    ]


def test_query_sees_sealed_rows_and_new_appends(
    engine: SqlEngine, table: MemoryTable, batch_factory: Any
) -> None:
    block = table.seal()
    assert block is not None
    table.append(*batch_factory("t", 0, 1000, 10))
    assert engine.query("SELECT count(*) AS n FROM events").column("n").to_pylist() == [1510]
    table.commit(block)
    assert engine.query("SELECT count(*) AS n FROM events").column("n").to_pylist() == [10]


def test_each_pipeline_is_a_table_of_its_name(
    engine: SqlEngine, schema: pa.Schema, batch_factory: Any
) -> None:
    other = MemoryTable("orders", schema, limit_bytes=1 << 20)
    other.append(*batch_factory("o", 0, 0, 7))
    engine.catalog.add(other)
    result = engine.query(
        "SELECT (SELECT count(*) FROM orders) AS o, (SELECT count(*) FROM events) AS e"
    )
    assert result.to_pylist() == [{"o": 7, "e": 1500}]
    with pytest.raises(ValueError, match="already in the catalog"):
        engine.catalog.add(other)
    with pytest.raises(ValueError, match="not a plain SQL identifier"):
        Catalog().add(MemoryTable("drop table; x", schema, limit_bytes=1))


def test_empty_table_is_queryable(schema: pa.Schema) -> None:
    catalog = Catalog()
    catalog.add(MemoryTable("empty", schema, limit_bytes=1 << 20))
    engine = SqlEngine(catalog)
    try:
        assert engine.query("SELECT count(*) AS n FROM empty").to_pylist() == [{"n": 0}]
    finally:
        engine.close()


REFUSED_STATEMENTS = [
    ("COPY events TO '/tmp/hakafka_buffer_leak.csv'", "COPY statements are refused"),
    ("COPY (SELECT 1) TO 'https://example.com/x.csv'", "COPY statements are refused"),
    ("ATTACH '/tmp/hakafka_buffer_other.db' AS other", "ATTACH statements are refused"),
    ("INSTALL httpfs", "; INSTALL statements are refused"),
    ("FORCE INSTALL httpfs", "; INSTALL statements are refused"),
    ("LOAD httpfs", "; LOAD statements are refused"),
    ("UPDATE EXTENSIONS", "; UPDATE statements are refused"),
    ("SET enable_external_access = true", "; SET statements are refused"),
    ("SET lock_configuration = false", "; SET statements are refused"),
    ("RESET enable_external_access", "; RESET statements are refused"),
    ("PRAGMA enable_profiling", "; PRAGMA statements are refused"),
    ("CREATE TABLE x AS SELECT * FROM events", "; CREATE statements are refused"),
    ("INSERT INTO events SELECT * FROM events", "; INSERT statements are refused"),
    # DuckDB's settings let these through; the guard alone refuses them (see buffer.sql).
    ("CREATE MACRO f(x) AS x + 1", "; CREATE statements are refused"),
    ("DROP TABLE events", "; DROP statements are refused"),
    ("ATTACH ':memory:' AS scratch", "; ATTACH statements are refused"),
    ("SET VARIABLE v = 1", "; SET statements are refused"),
    ("LOAD json", "; LOAD statements are refused"),
    ("EXPORT DATABASE '/tmp/hakafka_buffer_export'", "EXPORT statements are refused"),
    ("SELECT 1; SELECT 2", "exactly one statement is allowed, got 2"),
]


@pytest.mark.parametrize(("sql", "message"), REFUSED_STATEMENTS)
def test_non_select_statements_are_refused(engine: SqlEngine, sql: str, message: str) -> None:
    with pytest.raises(QueryRefusedError, match=message):
        engine.query(sql)


# Run past the statement guard: DuckDB's own settings (no external access, locked
# configuration) must refuse these by themselves.
SANDBOX_LAYER = [
    ("COPY (SELECT 1 AS x) TO '{out}/leak.csv'", duckdb.PermissionException, _NO_FILES),
    ("COPY events TO '{out}/leak.parquet' (FORMAT parquet)", duckdb.PermissionException, _NO_FILES),
    ("EXPORT DATABASE '{out}/export'", duckdb.PermissionException, _NO_FILES),
    ("ATTACH '{out}/other.db' AS other", duckdb.PermissionException, _NO_FILES),
    ("INSTALL httpfs", duckdb.PermissionException, _NO_FILES),
    (
        "LOAD httpfs",
        duckdb.PermissionException,
        "Loading external extensions is disabled through configuration",
    ),
    ("SET enable_external_access = true", duckdb.InvalidInputException, _LOCKED),
    ("SET lock_configuration = false", duckdb.InvalidInputException, _LOCKED),
    ("RESET enable_external_access", duckdb.InvalidInputException, _LOCKED),
    ("SET autoload_known_extensions = true", duckdb.InvalidInputException, _LOCKED),
    ("SELECT * FROM read_csv('{data}/in.csv')", duckdb.PermissionException, _NO_FILES),
    ("SELECT * FROM read_parquet('{data}/in.parquet')", duckdb.PermissionException, _NO_FILES),
]


@pytest.mark.parametrize(("sql", "cause", "message"), SANDBOX_LAYER)
def test_duckdb_settings_refuse_without_the_guard(
    engine: SqlEngine, tmp_path: Path, sql: str, cause: type[Exception], message: str
) -> None:
    out, data = tmp_path / "out", tmp_path / "data"
    out.mkdir()
    data.mkdir()
    (data / "in.csv").write_text("password\nhunter2\n")
    pq.write_table(pa.table({"password": ["hunter2"]}), data / "in.parquet")
    with pytest.raises(QueryError, match=re.escape(message)) as err:
        engine._execute(sql.format(out=out, data=data))
    assert isinstance(err.value.__cause__, cause)  # DuckDB's refusal, not ours
    assert list(out.iterdir()) == []


FILE_AND_URL_READERS = [
    "SELECT * FROM read_csv('/etc/passwd')",
    "SELECT * FROM read_csv_auto('/etc/hostname')",
    "SELECT * FROM read_parquet('/tmp/x.parquet')",
    "SELECT * FROM read_json('/etc/os-release')",
    "SELECT * FROM read_text('/etc/passwd')",
    "SELECT * FROM read_blob('/etc/passwd')",
    "SELECT * FROM glob('/etc/*')",
    "SELECT * FROM read_parquet('https://example.com/data.parquet')",
    "SELECT * FROM read_csv('s3://bucket/key.csv')",
]


@pytest.mark.parametrize("sql", FILE_AND_URL_READERS)
def test_file_and_url_readers_are_refused(engine: SqlEngine, sql: str) -> None:
    with pytest.raises(
        QueryRefusedError, match=r"refused by the sandbox: .*disabled by configuration"
    ):
        engine.query(sql)


def test_path_as_table_name_does_not_read_the_file(engine: SqlEngine) -> None:
    with pytest.raises(QueryError, match="Table with name /etc/passwd does not exist"):
        engine.query("SELECT * FROM '/etc/passwd'")


def test_python_variables_are_not_scanned(engine: SqlEngine) -> None:
    secret_rows = pa.table({"password": ["hunter2"]})
    assert secret_rows.num_rows == 1
    with pytest.raises(QueryError, match="Table with name secret_rows does not exist"):
        engine.query("SELECT * FROM secret_rows")


def test_settings_are_locked(engine: SqlEngine) -> None:
    rows = engine.query(
        "SELECT name, value FROM duckdb_settings() WHERE name IN "
        "('enable_external_access', 'lock_configuration', 'autoload_known_extensions', "
        "'autoinstall_known_extensions', 'allow_community_extensions')"
    ).to_pylist()
    assert {r["name"]: r["value"] for r in rows} == {
        "enable_external_access": "false",
        "lock_configuration": "true",
        "autoload_known_extensions": "false",
        "autoinstall_known_extensions": "false",
        "allow_community_extensions": "false",
    }


def test_timeout_interrupts_the_query(engine: SqlEngine) -> None:
    with pytest.raises(QueryTimeoutError, match=r"interrupted after the 1.0 s timeout"):
        engine.query("SELECT sum(a.range * b.range) FROM range(200000) a, range(200000) b")
    assert engine.query("SELECT count(*) AS n FROM events").to_pylist() == [{"n": 1500}]


def test_timeout_interrupts_a_streaming_result(schema: pa.Schema) -> None:
    engine = SqlEngine(Catalog(), QueryLimits(timeout_s=0.5, max_rows=10**9))
    try:
        with pytest.raises(QueryTimeoutError, match=r"interrupted after the 0.5 s timeout"):
            engine.query(
                "SELECT a.range FROM range(100000) a, range(100000) b "
                "WHERE (a.range + b.range) % 256 = 0"
            )
    finally:
        engine.close()


def test_row_limit_is_an_explicit_error(engine: SqlEngine) -> None:
    assert engine.query("SELECT * FROM events LIMIT 1200").num_rows == 1200
    with pytest.raises(RowLimitError, match="result has more than 1200 rows"):
        engine.query("SELECT * FROM events")


def test_bad_sql_gives_the_engine_message(engine: SqlEngine) -> None:
    with pytest.raises(QueryError, match='syntax error at or near "SELEC"'):
        engine.query("SELEC 1")
    with pytest.raises(QueryError, match='Referenced column "nope" not found'):
        engine.query("SELECT nope FROM events")


def test_query_limits_apply(schema: pa.Schema) -> None:
    engine = SqlEngine(Catalog(), QueryLimits(memory_bytes=100 << 20, threads=1))
    try:
        got = engine.query(
            "SELECT name, value FROM duckdb_settings() WHERE name IN ('threads', 'memory_limit') "
            "ORDER BY name"
        ).to_pylist()
    finally:
        engine.close()
    assert got[1] == {"name": "threads", "value": "1"}
    assert got[0]["name"] == "memory_limit" and got[0]["value"].startswith("100.0 MiB")
