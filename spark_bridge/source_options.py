"""The options of the ``hakafka_clickhouse`` data source (`ClickHouseOptions`), parsed once
from Spark's strings and given back as strings.

All strings: ``hosts`` (comma list of ``host:port``: the replicas of one shard, the first
reachable one is used), ``database``, ``table``, ``user``, ``password``, ``secure``,
``verify``, ``ca_cert``; writer: ``token_prefix`` (each task inserts once with
``insert_deduplication_token = <token_prefix>:<task index>``; without it ClickHouse
deduplicates by the block's content hash); reader: ``shards`` (instead of ``hosts``: shards
by ``;``, each its replicas by ``,`` in preference order; every shard is read once),
``columns`` (comma list), ``where`` (a ClickHouse boolean expression), ``committed_offsets``
(JSON partition -> next offset: only the rows below it), and as Spark's JDBC source
``partitionColumn`` (an integer key) with ``numPartitions`` ranges per shard whose stride
``lowerBound``/``upperBound`` decide (the key's min and max by default; every row is read,
the first and last ranges are open); without ``partitionColumn`` one Spark partition per
ClickHouse partition of each shard.

Loads no pyspark.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from chlib.clients import connect
from chlib.cluster import Hosts, format_shards
from chlib.connection import Connection
from chlib.tables import quote_identifier

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

# Options renamed to Spark's JDBC names: an old name is refused with its new one.
_RENAMED = {"partition_by": "partitionColumn", "partitions": "numPartitions"}


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


def parse_shards(raw: str) -> tuple[Hosts, ...]:
    """``"h1:1,h2:1;h3:1"`` as the replicas of each shard; ValueError names a bad entry."""
    return tuple(parse_hosts(part) for part in raw.split(";") if part.strip())


def _int_option(opts: Mapping[str, str], key: str, minimum: int | None = None) -> int | None:
    raw = opts.get(key.lower())
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        value = None
    if value is None or (minimum is not None and value < minimum):
        wanted = "an integer" if minimum is None else f"an integer >= {minimum}"
        raise ValueError(f"option {key!r}: expected {wanted}, got {raw!r}")
    return value


def _parse_offsets(raw: str) -> dict[int, int]:
    """The ``committed_offsets`` option: JSON ``{"partition": next_offset}``."""
    try:
        return {int(p): int(o) for p, o in json.loads(raw).items()}
    except (ValueError, TypeError, AttributeError) as exc:
        raise ValueError(
            f"option 'committed_offsets': expected JSON {{partition: offset}}, got {raw!r}"
        ) from exc


def _str_or_none(value: int | None) -> str | None:
    return None if value is None else str(value)


def _split_list(raw: str | None) -> tuple[str, ...] | None:
    if not raw:
        return None
    return tuple(part.strip() for part in raw.split(",") if part.strip())


@dataclass(frozen=True)
class ClickHouseOptions:
    """The data source's options, parsed once; `to_options` gives them back as strings."""

    hosts: Hosts
    database: str
    table: str
    connection: Connection = field(default_factory=Connection)
    shard_hosts: tuple[Hosts, ...] = ()
    """The replicas of each shard to read (``shards``); without it `hosts` is the one shard."""
    token_prefix: str | None = None
    task_tokens: tuple[str, ...] = ()
    """The token of each task by index, set by the flush (not a Spark option); without it a
    task's token is ``<token_prefix>:<task>``."""
    columns: tuple[str, ...] | None = None
    where: str | None = None
    committed_offsets: Mapping[int, int] | None = None
    """Partition -> next offset: only the rows below it are read (`include_buffer`)."""
    partition_column: str | None = None
    num_partitions: int | None = None
    lower_bound: int | None = None
    upper_bound: int | None = None

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> ClickHouseOptions:
        """Parse Spark options; ValueError names the missing or malformed option."""
        opts = {str(k).lower(): str(v) for k, v in options.items()}
        for key in ("database", "table"):
            if not opts.get(key):
                raise ValueError(f"option {key!r} is required")
        for old, new in _RENAMED.items():
            if old in opts:
                raise ValueError(f"option {old!r} is now {new!r} (as in Spark's JDBC source)")
        partition_column = opts.get("partitioncolumn") or None
        ranged = [k for k in ("numPartitions", "lowerBound", "upperBound") if k.lower() in opts]
        if ranged and not partition_column:
            raise ValueError(f"option {ranged[0]!r} needs option 'partitionColumn'")
        shard_hosts = parse_shards(opts["shards"]) if opts.get("shards") else ()
        committed = opts.get("committed_offsets")
        return cls(
            hosts=shard_hosts[0] if shard_hosts else parse_hosts(opts.get("hosts", "")),
            database=opts["database"],
            table=opts["table"],
            connection=Connection.from_options(opts),
            shard_hosts=shard_hosts,
            token_prefix=opts.get("token_prefix") or None,
            columns=_split_list(opts.get("columns")),
            where=opts.get("where") or None,
            committed_offsets=_parse_offsets(committed) if committed is not None else None,
            partition_column=partition_column,
            num_partitions=_int_option(opts, "numPartitions", minimum=1),
            lower_bound=_int_option(opts, "lowerBound"),
            upper_bound=_int_option(opts, "upperBound"),
        )

    def to_options(self) -> dict[str, str]:
        options = {
            "hosts": ",".join(f"{h}:{p}" for h, p in self.hosts),
            "database": self.database,
            "table": self.table,
            **self.connection.to_options(),
        }
        optional = {
            "shards": format_shards(self.shard_hosts) if self.shard_hosts else None,
            "token_prefix": self.token_prefix,
            "columns": ",".join(self.columns) if self.columns else None,
            "where": self.where,
            "committed_offsets": None
            if self.committed_offsets is None
            else json.dumps({str(p): o for p, o in self.committed_offsets.items()}),
            "partitionColumn": self.partition_column,
            "numPartitions": _str_or_none(self.num_partitions),
            "lowerBound": _str_or_none(self.lower_bound),
            "upperBound": _str_or_none(self.upper_bound),
        }
        options.update({k: v for k, v in optional.items() if v is not None})
        return options

    @property
    def shards(self) -> tuple[Hosts, ...]:
        """The replicas of each shard to read."""
        return self.shard_hosts or (self.hosts,)

    @property
    def qualified_table(self) -> str:
        return f"{quote_identifier(self.database)}.{quote_identifier(self.table)}"

    def client(self, hosts: Hosts | None = None) -> Client:
        """A client for the first of `hosts` (default: `hosts`, the writer's shard) that
        accepts a connection (the last error otherwise)."""
        return connect(self.connection, hosts or self.hosts, self.database)

    def token(self, task: int) -> str | None:
        if self.task_tokens:
            return self.task_tokens[task]
        return f"{self.token_prefix}:{task}" if self.token_prefix else None
