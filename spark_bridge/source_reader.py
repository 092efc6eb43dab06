"""The reader of the ``hakafka_clickhouse`` data source: every shard read once, each in
slices (one per ClickHouse partition, or per range of ``partitionColumn``) that Spark's tasks
read from the shard's replicas in turn, the next ones after a failure (the result is whole
before a row is yielded).

Spark filters that map to ClickHouse (comparisons, IN, IS [NOT] NULL, NOT, LIKE
prefix/suffix/substring) are pushed down into the WHERE clause (`filter_sql`).
"""

from __future__ import annotations

import datetime as dt
import decimal
import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import pyarrow as pa
import structlog
from pyspark.sql.datasource import (
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
)

from chlib.chtypes import needs_text_cast, text_type
from chlib.cluster import Hosts, committed_condition
from chlib.tables import quote_identifier, table_columns
from spark_bridge.source_options import ClickHouseOptions

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client
    from pyspark.sql.types import StructType

# Named for the data source this reader is part of.
log = structlog.get_logger("spark_bridge.datasource")
T = TypeVar("T")

# Arrow output the way Spark reads it: strings as strings, no dictionaries.
READ_SETTINGS = {
    "output_format_arrow_string_as_string": 1,
    "output_format_arrow_low_cardinality_as_dictionary": 0,
}


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


@dataclass(frozen=True)
class ShardSlice:
    """What one read task reads: a slice (`condition`, None for all) of shard `shard`,
    starting at its replica number `first` (spreading one read's tasks over the replicas)."""

    shard: int
    first: int
    condition: str | None


class ShardReadError(Exception):
    """Every replica of a shard failed one task's read; the message names each error."""


def read_replicas(
    hosts: Hosts, piece: ShardSlice, attempt: int, fetch: Callable[[str, int], T]
) -> T:
    """``fetch(host, port)`` from the shard's replicas in turn, from number ``piece.first +
    attempt`` (a retried Spark task starts at the next one), until one answers whole.
    Raises `ShardReadError` naming every replica's error."""
    errors = []
    for step in range(len(hosts)):
        host, port = hosts[(piece.first + attempt + step) % len(hosts)]
        try:
            return fetch(host, port)
        except Exception as exc:
            errors.append(f"{host}:{port}: {type(exc).__name__}: {str(exc)[:300]}")
            log.warning("read.replica_failed", shard=piece.shard, replica=f"{host}:{port}")
    raise ShardReadError(f"shard {piece.shard}: every replica failed: " + "; ".join(errors))


class ClickHouseReader(DataSourceReader):
    def __init__(self, options: ClickHouseOptions, schema: StructType) -> None:
        self.options = options
        self.schema = schema
        self.pushed: list[str] = []
        client = options.client(options.shards[0])
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
        if self.options.committed_offsets is not None:
            conditions.append(f"({committed_condition(self.options.committed_offsets)})")
        conditions += [f"({sql})" for sql in self.pushed]
        return " AND ".join(conditions) or None

    def partitions(self) -> Sequence[InputPartition]:
        """Every shard once: per shard, one slice per ClickHouse partition or per key range,
        their first replicas in turn."""
        pieces: list[InputPartition] = []
        for shard, hosts in enumerate(self.options.shards):
            conditions = read_replicas(hosts, ShardSlice(shard, 0, None), 0, self._slices)
            pieces += [
                InputPartition(ShardSlice(shard, i % len(hosts), c))
                for i, c in enumerate(conditions)
            ]
        return pieces

    def _slices(self, host: str, port: int) -> list[str | None]:
        """The slice conditions of the shard at `host:port` (None: all of it)."""
        client = self.options.connection.client(host, port, self.options.database)
        try:
            if self.options.partition_column:
                conditions = self._key_ranges(client, self.options.partition_column)
            else:
                rows = client.query(
                    "SELECT DISTINCT partition_id FROM system.parts WHERE database = {db:String}"
                    " AND table = {t:String} AND active ORDER BY partition_id",
                    parameters={"db": self.options.database, "t": self.options.table},
                ).result_rows
                conditions = (
                    [f"_partition_id = {sql_literal(str(r[0]))}" for r in rows]
                    if len(rows) > 1
                    else [None]
                )
        finally:
            client.close()
        return conditions

    def _key_ranges(self, client: Client, key: str) -> list[str | None]:
        """``numPartitions`` ranges of `key` as Spark's JDBC source cuts them: the stride from
        ``lowerBound``/``upperBound`` (the key's min and max by default), the first range
        open below (with NULLs), the last open above."""
        count = self.options.num_partitions or 1
        low, high = self.options.lower_bound, self.options.upper_bound
        if low is None or high is None:
            where = self.where()
            found = client.query(
                f"SELECT min(toInt64({key})), max(toInt64({key})), count() FROM"
                f" {self.options.qualified_table}" + (f" WHERE {where}" if where else "")
            ).result_rows[0]
            if not found[2]:
                return [None]
            low = int(found[0]) if low is None else low
            high = int(found[1]) if high is None else high
        count = min(count, max(1, high - low + 1))
        if count == 1:
            return [None]
        stride = -(-(high - low + 1) // count)
        value = f"toInt64({key})"
        bounds = [low + i * stride for i in range(1, count)]
        ranges: list[str | None] = [f"{value} < {bounds[0]} OR {value} IS NULL"]
        ranges += [f"{value} >= {a} AND {value} < {b}" for a, b in itertools.pairwise(bounds)]
        ranges.append(f"{value} >= {bounds[-1]}")
        return ranges

    def query(self, condition: str | None) -> str:
        columns = self.select
        conditions = [c for c in (self.where(), condition) if c]
        where = " WHERE " + " AND ".join(f"({c})" for c in conditions) if conditions else ""
        return f"SELECT {columns} FROM {self.options.qualified_table}{where}"

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext
        from pyspark.sql.pandas.types import to_arrow_schema

        piece: ShardSlice = partition.value
        # A timestamp is an instant: labelling it UTC keeps its value.
        target = to_arrow_schema(self.schema, timezone="UTC")
        context = TaskContext.get()
        attempt = context.attemptNumber() if context is not None else 0
        sql = self.query(piece.condition)

        def fetch(host: str, port: int) -> pa.Table:
            client = self.options.connection.client(host, port, self.options.database)
            try:
                return client.query_arrow(sql, settings=READ_SETTINGS)
            finally:
                client.close()

        table = read_replicas(self.options.shards[piece.shard], piece, attempt, fetch)
        yield from table.cast(target).to_batches()
