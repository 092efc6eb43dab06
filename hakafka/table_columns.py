"""`columns = "from_table"`: a pipeline's columns read from its existing ClickHouse table.

`with_table_columns` runs once when a command that needs the columns starts (`run`, `init`,
`config check --cluster`): every such pipeline gets the table's columns, in table order,
minus the meta columns (`_partition`, `_offset`, ... which the table must hold as
`meta_columns` says; `ensure_table` checks that). From then on the pipeline is one with
those columns declared: the shard-wide settings record them, a block's plan names them, and
a table changed later is compared with them at the next start. A column hakafka cannot fill
(an unsupported type, a flattened Nested column, a name reserved for meta columns) refuses
the whole config, naming every such column.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence

from chlib.tables import table_columns
from hakafka.config import ColumnConfig, Config, ConfigError, PipelineConfig
from hakafka.consumer import META_COLUMNS, SchemaError, arrow_type
from hakafka.consumer.schema import SUPPORTED_TYPES
from hakafka.settings import connection_of

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Reads a table's (name, type) pairs (None: no such table) from host:port.
ColumnReader = Callable[[str, int, str, str], list[tuple[str, str]] | None]


class TableColumnsError(Exception):
    """A `from_table` pipeline's table is missing, unreachable or has columns hakafka cannot
    fill; the message names the pipeline, the table and each problem."""


def columns_of_table(
    pipeline: PipelineConfig, table: str, actual: list[tuple[str, str]] | None
) -> tuple[ColumnConfig, ...]:
    """The declared columns of `pipeline` from its table's `(name, type)` pairs `actual`
    (None: the table does not exist); `TableColumnsError` names every column it cannot take."""
    where = f'pipeline {pipeline.name!r}: columns = "from_table"'
    if actual is None:
        raise TableColumnsError(f"{where}, but table {table} does not exist; create it first")
    meta = {name for name, _ in META_COLUMNS}
    problems, columns = [], []
    for name, ch_type in actual:
        if name in meta:
            continue
        if "." in name:
            problems.append(
                f"column {name!r} ({ch_type}) is a Nested column flattened into Arrays; "
                "create the table with SET flatten_nested = 0 to keep Nested(...) one column"
            )
        elif not _NAME.match(name) or name.startswith("_"):
            problems.append(
                f"column {name!r}: names starting with '_' are reserved for meta columns"
            )
        else:
            try:
                arrow_type(ch_type)
            except SchemaError:
                problems.append(f"column {name!r} has type {ch_type}, which is not supported")
            else:
                columns.append(ColumnConfig(name, ch_type))
    if problems:
        raise TableColumnsError(
            f"{where}: table {table} has columns hakafka cannot fill: {'; '.join(problems)} "
            f"({SUPPORTED_TYPES})"
        )
    if not columns:
        raise TableColumnsError(f"{where}: table {table} has no columns besides meta columns")
    return tuple(columns)


def with_table_columns(config: Config, read: ColumnReader | None = None) -> Config:
    """`config` with each `from_table` pipeline's columns read from its table on the first
    ClickHouse endpoint that answers (this node's shards first); `config` itself if there
    is none. Raises `ConfigError` naming each such pipeline's problem (`TableColumnsError`)."""
    if not any(p.columns_from_table for p in config.pipelines):
        return config
    reader = read or _client_reader(config)
    endpoints = _endpoints(config)
    pipelines, problems = [], []
    for index, pipeline in enumerate(config.pipelines):
        if not pipeline.columns_from_table:
            pipelines.append(pipeline)
            continue
        table = f"{config.clickhouse.database}.{pipeline.table}"
        try:
            actual = _read_first(reader, endpoints, config.clickhouse.database, pipeline, table)
            columns = columns_of_table(pipeline, table, actual)
        except TableColumnsError as exc:
            problems.append(f"pipelines[{index}].columns: {exc}")
            continue
        pipelines.append(dataclasses.replace(pipeline, columns=columns))
    if problems:
        raise ConfigError(config.source or "<config>", problems)
    return dataclasses.replace(config, pipelines=tuple(pipelines))


def _endpoints(config: Config) -> list[tuple[str, int]]:
    replicas = config.clickhouse.replicas
    order = [*config.shards, *(s for s in sorted(replicas) if s not in config.shards)]
    found: list[tuple[str, int]] = []
    for shard in order:
        for endpoint in replicas.get(shard, {}).values():
            if (endpoint.host, endpoint.port) not in found:
                found.append((endpoint.host, endpoint.port))
    return found


def _read_first(
    read: ColumnReader,
    endpoints: Sequence[tuple[str, int]],
    database: str,
    pipeline: PipelineConfig,
    table: str,
) -> list[tuple[str, str]] | None:
    errors = []
    for host, port in endpoints:
        try:
            return read(host, port, database, pipeline.table)
        except Exception as exc:  # any failure to reach or query: try the next endpoint
            errors.append(f"{host}:{port}: {type(exc).__name__}: {exc}")
    raise TableColumnsError(
        f'pipeline {pipeline.name!r}: columns = "from_table", but no ClickHouse endpoint '
        f"answered to read the columns of {table}: {'; '.join(errors) or 'none configured'}"
    )


def _client_reader(config: Config) -> ColumnReader:
    connection = connection_of(config)

    def read(host: str, port: int, database: str, table: str) -> list[tuple[str, str]] | None:
        client = connection.client(host, port)
        try:
            return table_columns(client, database, table)
        finally:
            client.close()

    return read
