"""`[pipelines.columns]` forms: a type, a `{ type, path }` table, or `"from_table"` (the
columns read from the existing ClickHouse table at start, refused naming what hakafka cannot
fill). Pure: the table's columns come from a stand-in reader."""

from __future__ import annotations

import textwrap
import tomllib
from typing import Any

import pytest

from hakafka.cli import clickhouse_type_problem
from hakafka.config import ColumnConfig, ConfigError, parse_config
from hakafka.settings import pipeline_schema
from hakafka.table_columns import with_table_columns

BASE = """
node = "n1"
shards = [0]
[zookeeper]
hosts = "127.0.0.1:2181"
[kafka]
bootstrap = "127.0.0.1:9092"
[clickhouse]
database = "db"
engine = "ReplicatedMergeTree"
[clickhouse.replicas.0]
n1 = "127.0.0.1:8123"
n2 = "127.0.0.1:8124"
[[pipelines]]
name = "events"
topic = "events"
table = "events"
"""


def config(columns: str) -> Any:
    data = tomllib.loads(textwrap.dedent(BASE) + textwrap.dedent(columns))
    return parse_config(data, "test.toml", clickhouse_type_problem)


def test_a_column_is_a_type_or_a_table_with_a_type_and_a_path() -> None:
    parsed = config(
        """
        [pipelines.columns]
        name = "String"
        user_id = { type = "UInt64", path = "user.id" }
        sku = { type = "Nullable(String)", path = "items[0].sku" }
        plain = { type = "UUID" }
        """
    )
    assert parsed.pipelines[0].columns == (
        ColumnConfig("name", "String"),
        ColumnConfig("user_id", "UInt64", "user.id"),
        ColumnConfig("sku", "Nullable(String)", "items[0].sku"),
        ColumnConfig("plain", "UUID"),
    )
    assert not parsed.pipelines[0].columns_from_table
    schema = pipeline_schema(parsed.pipelines[0])
    assert [c.steps for c in schema.columns] == [
        ("name",),
        ("user", "id"),
        ("items", 0, "sku"),
        ("plain",),
    ]


def test_a_bad_column_table_names_each_key() -> None:
    with pytest.raises(ConfigError) as raised:
        config(
            """
            [pipelines.columns]
            a = { path = "x" }
            b = { type = "Int8", path = "x..y" }
            c = { type = "Int8", color = "red" }
            d = { type = "Variant(Int8, String)" }
            e = 5
            """
        )
    problems = raised.value.problems
    assert "pipelines[0].columns.a.type: is required" in problems
    assert any(
        p.startswith("pipelines[0].columns.b.path: path 'x..y' is not keys") for p in problems
    )
    assert "pipelines[0].columns.c.color: unknown key" in problems
    assert any(
        p.startswith("pipelines[0].columns.d: ClickHouse type 'Variant(Int8, String)' is not")
        for p in problems
    )
    assert any(
        p.startswith("pipelines[0].columns.e: must be a ClickHouse type name") for p in problems
    )
    assert len(problems) == 5, problems


def reader(tables: dict[tuple[str, int], Any]) -> Any:
    """A column reader answering from `tables` per endpoint; an exception value is raised."""
    calls: list[tuple[str, int, str, str]] = []

    def read(host: str, port: int, database: str, table: str) -> Any:
        calls.append((host, port, database, table))
        answer = tables[(host, port)]
        if isinstance(answer, Exception):
            raise answer
        return answer

    read.calls = calls  # type: ignore[attr-defined]
    return read


def test_from_table_takes_the_tables_columns_but_meta_columns_from_the_first_endpoint_up() -> None:
    parsed = config('columns = "from_table"\n')
    assert parsed.pipelines[0].columns == () and parsed.pipelines[0].columns_from_table
    table = [
        ("id", "UUID"),
        ("kind", "Enum8('a' = 1)"),
        ("attrs", "Map(String, String)"),
        ("_partition", "Int32"),
        ("_offset", "Int64"),
    ]
    read = reader({("127.0.0.1", 8123): ConnectionError("refused"), ("127.0.0.1", 8124): table})
    resolved = with_table_columns(parsed, read)
    assert resolved.pipelines[0].columns == (
        ColumnConfig("id", "UUID"),
        ColumnConfig("kind", "Enum8('a' = 1)"),
        ColumnConfig("attrs", "Map(String, String)"),
    )
    assert read.calls == [("127.0.0.1", 8123, "db", "events"), ("127.0.0.1", 8124, "db", "events")]
    # A config without from_table is not read at all.
    plain = config('[pipelines.columns]\nid = "Int8"\n')
    assert with_table_columns(plain, reader({})) is plain


def test_from_table_refuses_every_column_it_cannot_fill_naming_it() -> None:
    table = [
        ("id", "UInt64"),
        ("v", "Variant(Int8, String)"),
        ("n.a", "Array(Int32)"),
        ("_secret", "String"),
        ("_offset", "Int64"),
    ]
    with pytest.raises(ConfigError) as raised:
        with_table_columns(config('columns = "from_table"\n'), reader({("127.0.0.1", 8123): table}))
    (problem,) = raised.value.problems
    assert problem.startswith(
        "pipelines[0].columns: pipeline 'events': columns = \"from_table\": table db.events has "
        "columns hakafka cannot fill: column 'v' has type Variant(Int8, String), which is not "
        "supported; column 'n.a' (Array(Int32)) is a Nested column flattened into Arrays; "
        "create the table with SET flatten_nested = 0 to keep Nested(...) one column; column "
        "'_secret': names starting with '_' are reserved for meta columns (supported: Int8"
    ), problem


def test_from_table_without_the_table_or_any_clickhouse_says_so() -> None:
    with pytest.raises(ConfigError, match=r"table db\.events does not exist; create it first"):
        with_table_columns(config('columns = "from_table"\n'), reader({("127.0.0.1", 8123): None}))
    down = reader(
        {("127.0.0.1", 8123): ConnectionError("refused"), ("127.0.0.1", 8124): OSError("reset")}
    )
    with pytest.raises(ConfigError) as raised:
        with_table_columns(config('columns = "from_table"\n'), down)
    assert raised.value.problems == [
        "pipelines[0].columns: pipeline 'events': columns = \"from_table\", but no ClickHouse "
        "endpoint answered to read the columns of db.events: 127.0.0.1:8123: ConnectionError: "
        "refused; 127.0.0.1:8124: OSError: reset"
    ]
