"""The ``clickhouse`` data source for Spark's Python Data Source API (writer and reader).

Options (all strings): ``hosts`` (comma list of ``host:port``; the first reachable one is
used), ``database``, ``table``, ``user``, ``password``, ``secure``, ``verify``, ``ca_cert``;
writer: ``token_prefix`` (each task inserts once with ``insert_deduplication_token =
<token_prefix>:<task index>``; without it ClickHouse deduplicates by the block's content
hash; every insert runs with `DEDUP_INSERT_SETTINGS`); reader: ``columns``
(comma list), ``where`` (a ClickHouse boolean expression), ``partition_by`` (an integer key
to split into ``partitions`` ranges; without it one Spark partition per ClickHouse
partition). Spark filters that map to ClickHouse (comparisons, IN, IS [NOT] NULL, NOT,
LIKE prefix/suffix/substring) are pushed down into the WHERE clause.
"""

from __future__ import annotations

import datetime as dt
import decimal
from collections.abc import Container, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    EqualNullSafe,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    IsNotNull,
    IsNull,
    LessThan,
    LessThanOrEqual,
    Not,
    StringContains,
    StringEndsWith,
    StringStartsWith,
    WriterCommitMessage,
)

from spark_bridge.chtypes import needs_text_cast, text_type
from spark_bridge.connection import Connection
from spark_bridge.tables import quote_identifier, table_columns

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client
    from pyspark.sql.types import StructType

SOURCE_NAME = "clickhouse"
# Sent with every insert, over whatever the user's profile or the server sets: a block is
# deduplicated (`insert_deduplicate`; from ClickHouse 26 `deduplicate_insert` overrides it)
# and written by the INSERT itself, not buffered and merged with other clients' rows into
# other blocks (`async_insert`).
DEDUP_INSERT_SETTINGS: Mapping[str, int | str] = {
    "insert_deduplicate": 1,
    "deduplicate_insert": "enable",
    "async_insert": 0,
}
# Pinned only where the server has them: an older server refuses an unknown setting.
_NEWER_SETTINGS = frozenset({"deduplicate_insert"})
# Arrow output the way Spark reads it: strings as strings, no dictionaries.
_READ_SETTINGS = {
    "output_format_arrow_string_as_string": 1,
    "output_format_arrow_low_cardinality_as_dictionary": 0,
}


def parse_hosts(raw: str) -> tuple[tuple[str, int], ...]:
    """``"h1:8123,h2:8123"`` as ``((h1, 8123), (h2, 8123))``; ValueError names a bad entry."""
    hosts = []
    for entry in (e.strip() for e in raw.split(",")):
        if not entry:
            continue
        host, sep, port = entry.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"option 'hosts': expected host:port, got {entry!r}")
        hosts.append((host.strip("[]"), int(port)))
    if not hosts:
        raise ValueError("option 'hosts' is required (comma list of host:port)")
    return tuple(hosts)


def _split_list(raw: str | None) -> tuple[str, ...] | None:
    if not raw:
        return None
    return tuple(part.strip() for part in raw.split(",") if part.strip())


@dataclass(frozen=True)
class ClickHouseOptions:
    """The data source's options, parsed once; `to_options` gives them back as strings."""

    hosts: tuple[tuple[str, int], ...]
    database: str
    table: str
    connection: Connection = field(default_factory=Connection)
    token_prefix: str | None = None
    task_tokens: tuple[str, ...] = ()
    """The token of each task by index, set by the flush (not a Spark option); without it a
    task's token is ``<token_prefix>:<task>``."""
    columns: tuple[str, ...] | None = None
    where: str | None = None
    partition_by: str | None = None
    partitions: int | None = None

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> ClickHouseOptions:
        """Parse Spark options; ValueError names the missing or malformed option."""
        opts = {str(k).lower(): str(v) for k, v in options.items()}
        for key in ("database", "table"):
            if not opts.get(key):
                raise ValueError(f"option {key!r} is required")
        partitions = opts.get("partitions")
        if partitions is not None and (not partitions.isdigit() or int(partitions) < 1):
            raise ValueError(
                f"option 'partitions': expected a positive integer, got {partitions!r}"
            )
        return cls(
            hosts=parse_hosts(opts.get("hosts", "")),
            database=opts["database"],
            table=opts["table"],
            connection=Connection.from_options(opts),
            token_prefix=opts.get("token_prefix") or None,
            columns=_split_list(opts.get("columns")),
            where=opts.get("where") or None,
            partition_by=opts.get("partition_by") or None,
            partitions=int(partitions) if partitions else None,
        )

    def to_options(self) -> dict[str, str]:
        options = {
            "hosts": ",".join(f"{h}:{p}" for h, p in self.hosts),
            "database": self.database,
            "table": self.table,
            **self.connection.to_options(),
        }
        optional = {
            "token_prefix": self.token_prefix,
            "columns": ",".join(self.columns) if self.columns else None,
            "where": self.where,
            "partition_by": self.partition_by,
            "partitions": str(self.partitions) if self.partitions else None,
        }
        options.update({k: v for k, v in optional.items() if v})
        return options

    @property
    def qualified_table(self) -> str:
        return f"{quote_identifier(self.database)}.{quote_identifier(self.table)}"

    def client(self) -> Client:
        """A client for the first host that accepts a connection (the last error otherwise)."""
        error: Exception | None = None
        for host, port in self.hosts:
            try:
                return self.connection.client(host, port, self.database)
            except Exception as exc:
                error = exc
        assert error is not None  # `hosts` is never empty
        raise error

    def token(self, task: int) -> str | None:
        if self.task_tokens:
            return self.task_tokens[task]
        return f"{self.token_prefix}:{task}" if self.token_prefix else None


@dataclass
class TaskInserted(WriterCommitMessage):
    """What one write task inserted (rows) under which deduplication token."""

    task: int
    rows: int
    token: str | None


def insert_settings(server_settings: Container[str], token: str | None) -> dict[str, int | str]:
    """The settings of one insert: `DEDUP_INSERT_SETTINGS` (the newer ones only if they are in
    `server_settings`, the names the server has) and the deduplication token, if any."""
    settings = {
        name: value
        for name, value in DEDUP_INSERT_SETTINGS.items()
        if name not in _NEWER_SETTINGS or name in server_settings
    }
    if token:
        settings["insert_deduplication_token"] = token
    return settings


def insert_task(
    options: ClickHouseOptions, task: int, batches: Iterable[pa.RecordBatch]
) -> TaskInserted:
    """Insert all of one task's `batches` as ONE request (one token, one ClickHouse block).

    The rows go as one Arrow record batch, however they came: ClickHouse (26) derives the
    deduplication ids of an insert from its token AND its input chunks, so the same rows
    with the same token but cut into other batches (a re-flush rebuilt from the WAL) would
    not be recognized as the same insert."""
    batch_list = list(batches)
    if not batch_list:
        return TaskInserted(task, 0, options.token(task))
    data = pa.Table.from_batches(batch_list).combine_chunks()
    token = options.token(task)
    client = options.client()
    settings = insert_settings(client.server_settings, token)
    try:
        client.insert_arrow(options.table, data, database=options.database, settings=settings)
    finally:
        client.close()
    return TaskInserted(task, data.num_rows, token)


class ClickHouseWriter(DataSourceArrowWriter):
    def __init__(self, options: ClickHouseOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TaskInserted:
        from pyspark import TaskContext

        context = TaskContext.get()
        task = context.partitionId() if context is not None else 0
        return insert_task(self.options, task, iterator)


# --- reader -----------------------------------------------------------------------------


def sql_literal(value: Any) -> str:
    """`value` as a ClickHouse literal; TypeError for values with no safe rendering."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float | decimal.Decimal):
        return repr(value) if isinstance(value, float) else str(value)
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    if isinstance(value, dt.datetime):
        return f"toDateTime64({sql_literal(value.isoformat(sep=' '))}, 6)"
    if isinstance(value, dt.date):
        return f"toDate({sql_literal(value.isoformat())})"
    raise TypeError(f"no ClickHouse literal for {type(value).__name__}")


def filter_sql(flt: Filter) -> str | None:
    """`flt` as a ClickHouse expression, or None if it cannot be pushed down exactly."""
    attribute = getattr(flt, "attribute", None)
    if attribute is not None and len(attribute) != 1:
        return None  # nested fields stay in Spark
    column = quote_identifier(attribute[0]) if attribute is not None else ""
    value = getattr(flt, "value", None)
    try:
        if isinstance(flt, EqualTo):
            return f"{column} = {sql_literal(value)}"
        if isinstance(flt, EqualNullSafe):
            return f"isNotDistinctFrom({column}, {sql_literal(value)})"
        comparisons = {
            GreaterThan: ">",
            GreaterThanOrEqual: ">=",
            LessThan: "<",
            LessThanOrEqual: "<=",
        }
        for kind, operator in comparisons.items():
            if isinstance(flt, kind):
                return f"{column} {operator} {sql_literal(value)}"
        if isinstance(flt, In):
            if not value:
                return "false"
            return f"{column} IN ({', '.join(sql_literal(v) for v in value)})"
        if isinstance(flt, IsNull):
            return f"{column} IS NULL"
        if isinstance(flt, IsNotNull):
            return f"{column} IS NOT NULL"
        if isinstance(flt, StringStartsWith):
            return f"startsWith({column}, {sql_literal(value)})"
        if isinstance(flt, StringEndsWith):
            return f"endsWith({column}, {sql_literal(value)})"
        if isinstance(flt, StringContains):
            return f"position({column}, {sql_literal(value)}) > 0"
    except TypeError:
        return None
    if isinstance(flt, Not):
        inner = filter_sql(flt.child)
        return f"NOT ({inner})" if inner is not None else None
    return None


def spark_arrow_type(arrow_type: pa.DataType) -> pa.DataType:
    """The Arrow type Spark can take for ClickHouse's `arrow_type` (unsigned -> wider signed)."""
    widen = {
        pa.uint8(): pa.int16(),
        pa.uint16(): pa.int32(),
        pa.uint32(): pa.int64(),
        pa.uint64(): pa.decimal128(20, 0),
        pa.large_string(): pa.string(),
        pa.large_binary(): pa.binary(),
    }
    if pa.types.is_dictionary(arrow_type):
        return spark_arrow_type(arrow_type.value_type)
    if pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type):
        return pa.list_(spark_arrow_type(arrow_type.value_type))
    if pa.types.is_map(arrow_type):
        return pa.map_(
            spark_arrow_type(arrow_type.key_type), spark_arrow_type(arrow_type.item_type)
        )
    if pa.types.is_struct(arrow_type):
        return pa.struct(
            [pa.field(f.name, spark_arrow_type(f.type), f.nullable) for f in arrow_type]
        )
    if pa.types.is_fixed_size_binary(arrow_type):
        return pa.binary()
    return widen.get(arrow_type, arrow_type)


def select_list(client: Client, options: ClickHouseOptions) -> str:
    """The SELECT list of the read: the chosen columns (all that ``SELECT *`` gives by
    default), each of a type whose Arrow output is not its text (UUID, IPv4, IPv6, Enum,
    JSON, at any depth) cast so that it is."""
    columns = table_columns(client, options.database, options.table)
    if columns is None:  # no such table: the query says so
        return "*"
    wanted = options.columns or tuple(name for name, _ in columns)
    types = dict(columns)
    return ", ".join(
        f"CAST({quote_identifier(name)} AS {text_type(types[name])}) AS {quote_identifier(name)}"
        if name in types and needs_text_cast(types[name])
        else quote_identifier(name)
        for name in wanted
    )


class ClickHouseReader(DataSourceReader):
    def __init__(self, options: ClickHouseOptions, schema: StructType) -> None:
        self.options = options
        self.schema = schema
        self.pushed: list[str] = []
        client = options.client()
        try:
            self.select = select_list(client, options)
        finally:
            client.close()

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:  # noqa: N802
        for flt in filters:
            sql = filter_sql(flt)
            if sql is None:
                yield flt
            else:
                self.pushed.append(sql)

    def where(self) -> str | None:
        conditions = [f"({self.options.where})"] if self.options.where else []
        conditions += [f"({sql})" for sql in self.pushed]
        return " AND ".join(conditions) or None

    def partitions(self) -> Sequence[InputPartition]:
        """One partition per ClickHouse partition, or per key range; the value is an extra
        WHERE condition (None: everything selected)."""
        client = self.options.client()
        try:
            if self.options.partition_by:
                return self._key_ranges(client, self.options.partition_by)
            rows = client.query(
                "SELECT DISTINCT partition_id FROM system.parts WHERE database = {db:String}"
                " AND table = {t:String} AND active ORDER BY partition_id",
                parameters={"db": self.options.database, "t": self.options.table},
            ).result_rows
        finally:
            client.close()
        if len(rows) <= 1:
            return [InputPartition(None)]
        return [InputPartition(f"_partition_id = {sql_literal(str(r[0]))}") for r in rows]

    def _key_ranges(self, client: Client, key: str) -> list[InputPartition]:
        count = self.options.partitions or 1
        where = self.where()
        bounds = client.query(
            f"SELECT min(toInt64({key})), max(toInt64({key})), count() FROM"
            f" {self.options.qualified_table}" + (f" WHERE {where}" if where else "")
        ).result_rows[0]
        low, high, rows = bounds
        if not rows or count == 1:
            return [InputPartition(None)]
        step = max(1, -(-(int(high) - int(low) + 1) // count))
        slices = []
        for start in range(int(low), int(high) + 1, step):
            slices.append(
                InputPartition(f"toInt64({key}) >= {start} AND toInt64({key}) < {start + step}")
            )
        return slices

    def query(self, condition: str | None) -> str:
        columns = self.select
        conditions = [c for c in (self.where(), condition) if c]
        where = " WHERE " + " AND ".join(f"({c})" for c in conditions) if conditions else ""
        return f"SELECT {columns} FROM {self.options.qualified_table}{where}"

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        from pyspark.sql.pandas.types import to_arrow_schema

        # A timestamp is an instant: labelling it UTC keeps its value.
        target = to_arrow_schema(self.schema, timezone="UTC")
        client = self.options.client()
        try:
            table = client.query_arrow(self.query(partition.value), settings=_READ_SETTINGS)
        finally:
            client.close()
        yield from table.cast(target).to_batches()


class ClickHouseDataSource(DataSource):
    """``spark.read.format("clickhouse")`` / ``df.write.format("clickhouse")``."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> StructType:
        from pyspark.sql.pandas.types import from_arrow_schema

        options = ClickHouseOptions.parse(self.options)
        client = options.client()
        try:
            empty = client.query_arrow(
                f"SELECT {select_list(client, options)} FROM {options.qualified_table} LIMIT 0",
                settings=_READ_SETTINGS,
            )
        finally:
            client.close()
        fields = [pa.field(f.name, spark_arrow_type(f.type), f.nullable) for f in empty.schema]
        return from_arrow_schema(pa.schema(fields))

    def reader(self, schema: StructType) -> ClickHouseReader:
        return ClickHouseReader(ClickHouseOptions.parse(self.options), schema)

    def writer(self, schema: StructType, overwrite: bool) -> ClickHouseWriter:
        if overwrite:
            raise ValueError("the clickhouse data source only appends (use mode 'append')")
        return ClickHouseWriter(ClickHouseOptions.parse(self.options))
