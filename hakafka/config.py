"""The daemon's configuration: one TOML file, validated completely before anything starts.

`load_config(path)` returns a `Config` or raises `ConfigError` listing every problem, each
naming its key (`pipelines[0].buffer.max_rows`) and what is allowed. Unknown keys are errors
(a typo must not silently fall back to a default). Secrets come from files or environment
variables and never appear in `repr()`, logs or config errors; an environment variable set
but empty is an error (it would override a `*_file` and turn auth off). The query servers
fail closed: binding a non-loopback address without a token is an error.

Each key is declared once, as a field of its section's dataclass: its name is the TOML key,
its default the default, its kind that of the default, and an extra rule (`_checked`) or a
secret's environment variable (`env`) sits in the field's metadata; `_Reader.section`
reads a section from those declarations. Only keys with structure of their own (tables of
replicas, columns, partitions, settings) have readers of their own. An option
with a fixed set of values is the enum of the library that uses it (`wal.FsyncPolicy`,
`spark_bridge.tables.Engine`, `hakafka.consumer.Format`/`OnError`/`OutOfRange`); the config
holds the member.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
import socket
import ssl
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

from buffer.limits import QueryLimits, ServerLimits
from hakafka.consumer import (
    ALWAYS_META,
    MANAGED_SETTINGS,
    DecodeOptions,
    Format,
    OnError,
    OutOfRange,
    check_explicit_assignment,
)
from hakafka.consumer import META_COLUMNS as META_COLUMN_TYPES
from hakafka.consumer.schema import parse_path
from hakafka.logs import LogLevel
from spark_bridge.connection import is_loopback
from spark_bridge.handoff import PortRange
from spark_bridge.tables import Engine
from wal import FsyncPolicy

DEFAULT_PATH = Path("/etc/hakafka/hakafka.toml")

# Environment variables that override secrets (the file may leave them out entirely).
ENV_ZK_PASSWORD = "HAKAFKA_ZK_PASSWORD"
ENV_CLICKHOUSE_PASSWORD = "HAKAFKA_CLICKHOUSE_PASSWORD"
ENV_SERVER_TOKEN = "HAKAFKA_SERVER_TOKEN"
ENV_SCHEMA_REGISTRY_PASSWORD = "HAKAFKA_SCHEMA_REGISTRY_PASSWORD"
ENV_KAFKA_PREFIX = "HAKAFKA_KAFKA_"  # HAKAFKA_KAFKA_SASL_PASSWORD -> sasl.password

META_COLUMNS = tuple(name for name, _ in META_COLUMN_TYPES)
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
_NODE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
_HOST = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?$")

T = TypeVar("T")
E = TypeVar("E", bound=StrEnum)
C = TypeVar("C")


class ConfigError(ValueError):
    """The configuration is invalid; `problems` lists each one as `key: what is wrong`."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = problems
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"invalid configuration {source}:\n{lines}")


@dataclass(frozen=True)
class Secret:
    """A secret value that never shows itself in repr/str."""

    value: str = field(repr=False)

    def __repr__(self) -> str:
        return "Secret('***')" if self.value else "Secret('')"

    __str__ = __repr__

    def __bool__(self) -> bool:
        return bool(self.value)


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


def _checked(default: Any, check: Callable[[Any], str | None]) -> Any:
    """A config field whose value must also pass `check` (a problem text, or None)."""
    return field(default=default, metadata={"check": check})


def _zk_root_problem(value: str) -> str | None:
    if not value.startswith("/") or value.endswith("/") or "//" in value:
        return f"must be an absolute ZooKeeper path like /hakafka/prod, got {value!r}"
    return None


def _name_problem(value: str) -> str | None:
    return (
        None
        if _NAME.match(value)
        else f"must be a plain identifier ([A-Za-z_][A-Za-z0-9_]*), got {value!r}"
    )


def _not_negative_problem(value: int) -> str | None:
    return None if value >= 0 else f"must be >= 0, got {value}"


def _segment_problem(value: int) -> str | None:
    return None if value >= 1 << 20 else "must be at least 1048576 (1 MiB)"


def _readable_problem(value: str) -> str | None:
    """A file this process can read (or "" for none)."""
    try:
        if value:
            Path(value).read_bytes()
    except OSError as exc:
        return f"cannot read {value}: {exc.strerror}"
    return None


def _ca_file_problem(value: str) -> str | None:
    """A PEM file of CA certificates (or "" for the system's)."""
    if (unreadable := _readable_problem(value)) is not None or not value:
        return unreadable
    try:
        ssl.create_default_context(cafile=value)
    except ssl.SSLError as exc:
        return f"{value} holds no PEM CA certificate ({exc.reason})"
    return None


def _host_problem(value: str) -> str | None:
    """A host name or IP address (IPv6 in brackets or not), without scheme or port."""
    if not value or _HOST.match(value) or _ip(value) is not None:
        return None
    return f"must be a host name or IP address without scheme or port, got {value!r}"


def _transform_problem(value: str) -> str | None:
    if not value or value.lstrip().lower().startswith("select") or re.match(r"^[\w.]+:\w+$", value):
        return None
    return f"must be `module:function` or a SQL SELECT over the view `block`, got {value!r}"


# Every field with a default is read by `_Reader.section`: its TOML key is the field name, its
# kind that of the default (numbers must be > 0), its extra rule the `check` in its metadata.


@dataclass(frozen=True)
class ZooKeeperConfig:
    hosts: str
    root: str = _checked("/hakafka/default", _zk_root_problem)
    session_timeout: float = 6.0
    connect_timeout: float = 10.0
    request_timeout: float = 5.0
    auth_user: str = ""
    auth_password: Secret = field(default=Secret(""), metadata={"env": ENV_ZK_PASSWORD})
    # A root that anyone may change: false warns at start (`zookeeper.acl_open`), true refuses.
    require_acl: bool = False
    # TLS to the ensemble's secureClientPort: the server verified against `ca_file` ("" = the
    # system's CAs) and its host name; `cert_file` and `key_file` (PEM, both or neither) for
    # servers that require client certificates (ssl.clientAuth=need).
    tls: bool = False
    ca_file: str = _checked("", _ca_file_problem)
    cert_file: str = _checked("", _readable_problem)
    key_file: str = _checked("", _readable_problem)


@dataclass(frozen=True)
class KafkaConfig:
    bootstrap: str
    out_of_range: OutOfRange = OutOfRange.FAIL
    # Mirror each checkpoint to the pipeline's consumer group (visibility only).
    commit_offsets: bool = True
    settings: Mapping[str, str] = field(default_factory=dict, repr=False)


@dataclass(frozen=True)
class ClickHouseConfig:
    replicas: Mapping[int, Mapping[str, Endpoint]]  # shard -> node -> HTTP endpoint
    database: str = _checked("default", _name_problem)
    user: str = "default"
    password: Secret = field(default=Secret(""), metadata={"env": ENV_CLICKHOUSE_PASSWORD})
    secure: bool = False
    verify: bool = True
    # PEM CAs that verify ClickHouse's certificate (secure = true); "" = the system's.
    ca_file: str = _checked("", _ca_file_problem)
    engine: Engine = Engine.MERGE_TREE
    dedup_window: int = 10_000
    insert_timeout: float = 60.0


def _port_range_problem(value: str) -> str | None:
    """A `spark_bridge.handoff.PortRange` as written (or "" for none)."""
    try:
        if value:
            PortRange.parse(value)
    except ValueError as exc:
        return str(exc)
    return None


@dataclass(frozen=True)
class SparkConfig:
    master: str = "local[2]"
    # A Spark Connect URL may carry `;token=`, and conf values may be secrets: not in repr.
    remote: str = field(default="", repr=False)
    driver_memory: str = "2g"
    on_followers: bool = True
    rows_per_task: int = 500_000
    conf: Mapping[str, str] = field(default_factory=dict, repr=False)
    # The host Spark's executors reach this node's flush handoff at; "" = Spark's driver host
    # (classic), 127.0.0.1 (Spark Connect: required when its server is on another host).
    handoff_host: str = _checked("", _host_problem)
    # The address the handoff listens on; "" = handoff_host (0.0.0.0 behind NAT).
    handoff_bind: str = _checked("", _host_problem)
    # The ports the handoff may listen on, "41000-41099" or one port (each flush in progress
    # holds one); "" = one the system picks.
    handoff_ports: str = _checked("", _port_range_problem)


@dataclass(frozen=True)
class NodeServerConfig:
    http: Endpoint = Endpoint("127.0.0.1", 8300)
    flight: Endpoint = Endpoint("127.0.0.1", 8301)
    token: Secret = field(default=Secret(""), metadata={"env": ENV_SERVER_TOKEN})
    # A pipeline thread without progress for this long is stuck: not ready, no watchdog ping.
    stuck_after: float = 120.0
    # Bounds per client of the query servers: the library's defaults, declared there.
    max_request_bytes: int = ServerLimits.max_request_bytes
    request_timeout: float = ServerLimits.request_timeout
    max_connections: int = ServerLimits.max_connections
    max_concurrent_queries: int = ServerLimits.max_concurrent_queries
    # Bounds per query of the SQL engine behind both servers: the library's defaults.
    query_timeout: float = QueryLimits.timeout_s
    max_result_rows: int = QueryLimits.max_rows
    max_result_bytes: int = QueryLimits.max_result_bytes
    query_memory_bytes: int = QueryLimits.memory_bytes
    query_threads: int = QueryLimits.threads
    # Disk for sorts and joins that outgrow memory, in <data_dir>/query-spill; 0 = none.
    max_spill_bytes: int = _checked(QueryLimits.max_spill_bytes, _not_negative_problem)
    # The host other nodes and the ops commands reach this node's servers at; "" = the bind
    # host (see `advertised_host`).
    advertise: str = _checked("", _host_problem)
    # HTTPS and grpc+tls with this certificate chain and key (both PEM, both or neither).
    tls_cert_file: str = _checked("", _readable_problem)
    tls_key_file: str = _checked("", _readable_problem)
    # PEM CAs the clients (forwarding, `hakafka query` and `status`) verify nodes with; ""
    # = the system's. Either TLS key makes them refuse a plain-text node address.
    tls_ca_file: str = _checked("", _ca_file_problem)


@dataclass(frozen=True)
class PipelineBufferConfig:
    min_rows: int = 100_000
    max_rows: int = 2_000_000
    min_bytes: int = 16 << 20
    max_bytes: int = 256 << 20
    min_age: float = 5.0
    max_age: float = 30.0
    limit_bytes: int = 1 << 30


@dataclass(frozen=True)
class PipelineWalConfig:
    fsync: FsyncPolicy = FsyncPolicy.BATCH
    interval_ms: int = 50
    segment_bytes: int = _checked(64 << 20, _segment_problem)


@dataclass(frozen=True)
class SchemaRegistryConfig:
    """`[schema_registry]`: where `avro` (without `schema_file`) and `protobuf` pipelines
    find their writer schemas. `url` may list several, comma-separated."""

    url: str = ""
    user: str = ""
    password: Secret = field(default=Secret(""), metadata={"env": ENV_SCHEMA_REGISTRY_PASSWORD})
    # PEM CAs that verify an https registry's certificate; "" = the system's.
    ca_file: str = _checked("", _ca_file_problem)
    timeout: float = 10.0


@dataclass(frozen=True)
class ColumnConfig:
    """One `[pipelines.columns]` entry: `name = "Type"`, or `name = { type = "Type", path =
    "user.id" }` to read the value at a path of a JSON message."""

    name: str
    clickhouse_type: str
    path: str = ""


# `columns = "from_table"`: the columns are those of the existing table, read at start.
COLUMNS_FROM_TABLE = "from_table"


@dataclass(frozen=True)
class PipelineConfig:
    name: str
    topic: str
    table: str
    columns: tuple[ColumnConfig, ...]
    # columns = "from_table": `columns` is empty until `hakafka.table_columns` fills it.
    columns_from_table: bool = False
    format: Format = Format.JSON
    # format = "avro" only: plain Avro records of this writer schema (.avsc), no registry.
    schema_file: str = _checked("", _readable_problem)
    order_by: str = "(_partition, _offset)"
    partition_by: str = ""
    ttl: str = ""
    meta_columns: tuple[str, ...] = META_COLUMNS
    on_error: OnError = OnError.DEAD_LETTER
    max_message_bytes: int = DecodeOptions.max_message_bytes
    dead_letter_bytes: int = DecodeOptions.dead_letter_bytes
    consumer_group: str = ""  # where checkpoints are mirrored; "" is hakafka.<name>
    transform: str = _checked("", _transform_problem)
    partitions: Mapping[int, tuple[int, ...]] = field(default_factory=dict)
    buffer: PipelineBufferConfig = PipelineBufferConfig()
    wal: PipelineWalConfig = PipelineWalConfig()

    @property
    def dead_letter_table(self) -> str:
        return f"{self.table}_dead_letter"

    @property
    def group(self) -> str:
        """The Kafka consumer group that shows this pipeline's checkpoints."""
        return self.consumer_group or f"hakafka.{self.name}"


@dataclass(frozen=True, kw_only=True)
class Config:
    node: str
    shards: tuple[int, ...]
    shard_count: int = 1
    data_dir: Path = Path("/var/lib/hakafka")
    zookeeper: ZooKeeperConfig
    kafka: KafkaConfig
    clickhouse: ClickHouseConfig
    spark: SparkConfig
    server: NodeServerConfig
    pipelines: tuple[PipelineConfig, ...]
    schema_registry: SchemaRegistryConfig = SchemaRegistryConfig()
    # The least severe log level written (`hakafka run --log-level` overrides it).
    log_level: LogLevel = LogLevel.INFO
    # Refuse the config when any hop would carry data or control in plain text.
    require_tls: bool = False
    source: str = ""

    def pipeline(self, name: str) -> PipelineConfig:
        for p in self.pipelines:
            if p.name == name:
                return p
        raise KeyError(f"no pipeline named {name!r}")


class _Reader:
    """Reads one TOML table, recording problems with full key paths instead of raising."""

    def __init__(self, data: Mapping[str, Any], path: str, problems: list[str]) -> None:
        self.data = data
        self.path = path
        self.problems = problems
        self.seen: set[str] = set()

    def key(self, name: str) -> str:
        return f"{self.path}.{name}" if self.path else name

    def problem(self, name: str, text: str) -> None:
        self.problems.append(f"{self.key(name)}: {text}")

    def get(
        self,
        name: str,
        kind: type[T] | tuple[type, ...],
        default: T | None = None,
        *,
        required: bool = False,
        check: Callable[[Any], str | None] | None = None,
        secret: bool = False,
    ) -> T:
        """The value of key `name` as `kind`, or `default` with a problem recorded; a
        `secret` value is never quoted in the problem."""
        self.seen.add(name)
        if name not in self.data:
            if required:
                self.problem(name, "is required")
            return default  # type: ignore[return-value]
        value = self.data[name]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        # TOML integers are acceptable where a float is wanted; bools are never numbers.
        if float in kinds and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            names = " or ".join(_type_name(k) for k in kinds)
            shown = "" if secret else f" {value!r}"
            self.problem(name, f"must be {names}, got {_type_name(type(value))}{shown}")
            return default  # type: ignore[return-value]
        if check is not None and (text := check(value)) is not None:
            self.problem(name, text)
            return default  # type: ignore[return-value]
        return value  # type: ignore[return-value]

    def choice(self, name: str, kind: type[E], default: E) -> E:
        """One of the values of the enum `kind`, as its member."""
        allowed = [member.value for member in kind]
        value = self.get(
            name,
            str,
            default.value,
            check=lambda v: (
                None if v in allowed else f"must be one of {', '.join(allowed)}; got {v!r}"
            ),
        )
        return kind(value)

    def table(self, name: str, *, required: bool = False) -> _Reader:
        raw = self.get(name, dict, {}, required=required)
        return _Reader(raw if isinstance(raw, dict) else {}, self.key(name), self.problems)

    def positive(self, name: str, kind: type[T], default: T) -> T:
        return self.get(name, kind, default, check=_positive)

    def env(self, name: str, env_var: str) -> str | None:
        """The environment variable `env_var` (overriding key `name`), None if unset; set but
        empty is a problem (it would silently override a `*_file` and turn auth off)."""
        value = os.environ.get(env_var)
        if value == "":
            self.problem(name, f"the environment variable {env_var} is set but empty; unset it")
        return value

    def secret(self, name: str, env_var: str) -> Secret:
        """A secret from `<name>` (inline), `<name>_file` (a file) or the environment."""
        inline = self.get(name, str, "", secret=True)
        file_name = self.get(f"{name}_file", str, "")
        if (from_env := self.env(name, env_var)) is not None:
            return Secret(from_env)
        if file_name:
            try:
                if value := Path(file_name).read_text().strip():
                    return Secret(value)
                self.problem(f"{name}_file", f"{file_name} is empty")
            except OSError as exc:
                self.problem(f"{name}_file", f"cannot read {file_name}: {exc.strerror}")
        return Secret(inline)

    def section(self, kind: type[C], **given: Any) -> C:
        """The config dataclass `kind` read from this table: each field with a default by its
        name, as the default's kind (numbers must be > 0; enums one of their values; secrets
        from the environment, `<key>_file` or `<key>`; endpoints `host:port`), with the
        field's own `check` if it has one. `given` holds the fields read some other way. Any
        other key of the table is a problem (`finish`)."""
        values = dict(given)
        for f in dataclasses.fields(kind):  # type: ignore[arg-type]
            if f.name not in values:
                values[f.name] = self._field(f)
        self.finish()
        return kind(**values)

    def _field(self, f: dataclasses.Field[Any]) -> Any:
        name, default, check = f.name, f.default, f.metadata.get("check")
        if isinstance(default, Secret):
            return self.secret(name, f.metadata["env"])
        if isinstance(default, Endpoint):
            return _endpoint(self, name, default)
        if isinstance(default, StrEnum):
            return self.choice(name, type(default), default)
        if isinstance(default, bool | str):
            return self.get(name, type(default), default, check=check)
        if isinstance(default, int | float):
            return self.get(name, type(default), default, check=check or _positive)
        raise TypeError(f"config field {name} has no default to read it by")

    def finish(self) -> None:
        """Record every key that no reader asked for as unknown."""
        for name in sorted(set(self.data) - self.seen):
            self.problem(name, "unknown key")


def _positive(value: float) -> str | None:
    return None if value > 0 else f"must be > 0, got {value}"


def _type_name(kind: type) -> str:
    return {
        str: "a string",
        int: "an integer",
        float: "a number",
        bool: "true or false",
        dict: "a table",
        list: "an array",
    }.get(kind, kind.__name__)


def _endpoint(reader: _Reader, name: str, default: Endpoint) -> Endpoint:
    raw = reader.get(name, str, str(default))
    return parse_endpoint(raw, reader.key(name), reader.problems) or default


def parse_endpoint(raw: str, key: str, problems: list[str]) -> Endpoint | None:
    """`host:port` (an `http://` prefix is accepted) or None with a problem recorded."""
    text = raw.removeprefix("http://").removeprefix("https://").rstrip("/")
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        problems.append(f"{key}: must be host:port, got {raw!r}")
        return None
    return Endpoint(host, int(port))


def _zookeeper(r: _Reader) -> ZooKeeperConfig:
    z = r.section(ZooKeeperConfig, hosts=r.get("hosts", str, "", required=True))
    if z.auth_password and not z.auth_user:
        r.problem("auth_user", "is required when a ZooKeeper password is set")
    if not z.tls:
        for key in ("ca_file", "cert_file", "key_file"):
            if getattr(z, key):
                r.problem(key, "is set but zookeeper.tls is false: set tls = true to use it")
    _check_key_pair(r, z, "cert_file", "key_file")
    return z


def _check_key_pair(r: _Reader, section: object, cert_key: str, key_key: str) -> None:
    """The certificate and private key files of `r`'s section at `cert_key` and `key_key`:
    both or neither, and (when both were read) they load together as a TLS key pair."""
    if bool(r.data.get(cert_key)) != bool(r.data.get(key_key)):
        given, missing = (cert_key, key_key) if r.data.get(cert_key) else (key_key, cert_key)
        r.problem(missing, f"is required with {r.key(given)} (both or neither)")
        return
    cert, key = getattr(section, cert_key), getattr(section, key_key)
    if cert and key:
        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_cert_chain(cert, key)
        except (OSError, ssl.SSLError) as exc:
            r.problem(cert_key, f"cannot load it with {r.key(key_key)}: {exc}")


def _kafka(r: _Reader) -> KafkaConfig:
    settings_reader = r.table("settings")
    settings: dict[str, str] = {}
    for key, value in settings_reader.data.items():
        settings_reader.seen.add(key)
        if isinstance(value, bool):
            settings[key] = "true" if value else "false"
        elif isinstance(value, str | int | float):
            settings[key] = str(value)
        else:
            settings_reader.problem(key, "must be a string, number or boolean (librdkafka setting)")
    for name in os.environ:
        if name.startswith(ENV_KAFKA_PREFIX) and name != "HAKAFKA_KAFKA_BOOTSTRAP":
            key = name.removeprefix(ENV_KAFKA_PREFIX).lower().replace("_", ".")
            if (value := settings_reader.env(key, name)) is not None:
                settings[key] = value
    for reserved in sorted(MANAGED_SETTINGS & settings.keys()):
        settings_reader.problem(reserved, "is managed by hakafka (exactly-once relies on it)")
    return r.section(
        KafkaConfig, bootstrap=r.get("bootstrap", str, "", required=True), settings=settings
    )


def _clickhouse(r: _Reader, shards: tuple[int, ...]) -> ClickHouseConfig:
    d = ClickHouseConfig
    replicas_reader = r.table("replicas", required=True)
    replicas: dict[int, dict[str, Endpoint]] = {}
    for shard_key, nodes in replicas_reader.data.items():
        replicas_reader.seen.add(shard_key)
        key = replicas_reader.key(shard_key)
        if not shard_key.isdigit():
            r.problems.append(f'{key}: shard keys must be shard numbers like "0"')
            continue
        if not isinstance(nodes, dict) or not nodes:
            r.problems.append(f'{key}: must be a table of node = "host:port"')
            continue
        replicas[int(shard_key)] = {}
        for node, url in nodes.items():
            if not isinstance(url, str):
                r.problems.append(f'{key}.{node}: must be "host:port"')
            elif (ep := parse_endpoint(url, f"{key}.{node}", r.problems)) is not None:
                replicas[int(shard_key)][node] = ep
    for shard in shards:
        if replicas_reader.data and shard not in replicas:
            replicas_reader.problem(
                str(shard), f"no ClickHouse replicas for shard {shard} that this node serves"
            )
    # With MergeTree, a shard's endpoints must reach one server: no address tells that, the
    # tables' UUIDs do, so `init` and each term check it (`spark_bridge.tables.check_one_table`).
    engine = r.choice("engine", Engine, d.engine)
    ch = r.section(ClickHouseConfig, replicas=replicas, engine=engine)
    if ch.ca_file and not (ch.secure and ch.verify):
        r.problem(
            "ca_file", "verifies ClickHouse's certificate: needs secure = true, verify = true"
        )
    return ch


def _spark(r: _Reader) -> SparkConfig:
    conf_reader = r.table("conf")
    conf = {}
    for key, value in conf_reader.data.items():
        conf_reader.seen.add(key)
        conf[key] = str(value).lower() if isinstance(value, bool) else str(value)
    spark = r.section(SparkConfig, conf=conf)
    server = urlsplit(spark.remote).hostname if spark.remote else None
    if server is not None and not is_loopback(server) and not spark.handoff_host:
        r.problem(
            "handoff_host",
            f"is required with a Spark Connect server on another host ({server}): its "
            "executors fetch each block from this node; set it to the address they reach "
            "this node at",
        )
    return spark


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """`host` (`[::1]` brackets allowed) as an IP address, or None for a host name."""
    try:
        return ipaddress.ip_address(host.removeprefix("[").removesuffix("]"))
    except ValueError:
        return None


def advertised_host(server: NodeServerConfig, bind: Endpoint) -> str:
    """The host recorded in `nodes/<node>` for a server bound to `bind`: `server.advertise`,
    else the bind host, a wildcard (0.0.0.0, ::) standing for loopback (127.0.0.1, ::1)."""
    if server.advertise:
        return server.advertise
    ip = _ip(bind.host)
    if ip is not None and ip.is_unspecified:
        return "127.0.0.1" if ip.version == 4 else "[::1]"
    return bind.host


def _other_hosts(config: Config) -> list[str]:
    """`node = endpoint` of the other nodes in [clickhouse.replicas] whose ClickHouse is not
    on loopback: such nodes run on other hosts, so this cluster spans several."""
    return [
        f"{node} = {endpoint}"
        for nodes in config.clickhouse.replicas.values()
        for node, endpoint in sorted(nodes.items())
        if node != config.node and not is_loopback(endpoint.host)
    ]


def _check_advertise(config: Config, problems: list[str]) -> None:
    """On a cluster spanning hosts, the advertised hosts must be reachable from the others:
    else a follower would forward queries to "the leader" at its own loopback address."""
    s = config.server
    others = _other_hosts(config)
    local = sorted({h for ep in (s.http, s.flight) if is_loopback(h := advertised_host(s, ep))})
    if others and local:
        which = (
            f"{', '.join(local)} is a loopback address"
            if s.advertise
            else f"unset, so this node registers {', '.join(local)} (from its binds)"
        )
        problems.append(
            f"server.advertise: {which}, which other hosts cannot reach, while the cluster "
            f"spans hosts ([clickhouse.replicas] has {others[0]}); set server.advertise to "
            "the name or address others reach this node at"
        )


def _server(r: _Reader) -> NodeServerConfig:
    """`[server]`, failing closed: a bind other hosts can reach needs a token."""
    s = r.section(NodeServerConfig)
    _check_key_pair(r, s, "tls_cert_file", "tls_key_file")
    for name in ("http", "flight"):
        host = getattr(s, name).host
        if not s.token and not is_loopback(host):
            r.problem(
                name,
                f"binds {host}, reachable from other hosts, without a token; set "
                f"server.token_file (or {ENV_SERVER_TOKEN}), or bind 127.0.0.1",
            )
    if _same_address(s.http, s.flight):
        r.problem(
            "flight",
            f"{s.flight} is also server.http's address ({s.http}): the two servers cannot "
            "share a port; give each its own",
        )
    return s


def _same_address(a: Endpoint, b: Endpoint) -> bool:
    """True when servers bound to `a` and `b` would take the same socket: one port, and one
    host or a wildcard (0.0.0.0, ::) on either side."""
    if a.port != b.port:
        return False
    wildcard = any(ip is not None and ip.is_unspecified for ip in (_ip(a.host), _ip(b.host)))
    return wildcard or a.host == b.host


def _buffer(r: _Reader) -> PipelineBufferConfig:
    b = r.section(PipelineBufferConfig)
    for low, high in (("min_rows", "max_rows"), ("min_bytes", "max_bytes"), ("min_age", "max_age")):
        if getattr(b, low) > getattr(b, high):
            r.problem(low, f"must not exceed {high} ({getattr(b, low)} > {getattr(b, high)})")
    if b.limit_bytes < b.max_bytes:
        r.problem("limit_bytes", f"must be at least max_bytes ({b.limit_bytes} < {b.max_bytes})")
    return b


def _columns(r: _Reader, check_type: Callable[[str], str | None]) -> list[ColumnConfig]:
    """`[pipelines.columns]`: `name = "Type"` or `name = { type = "Type", path = "a.b" }`."""
    columns_reader = r.table("columns", required=True)
    columns = []
    for name, value in columns_reader.data.items():
        columns_reader.seen.add(name)
        key = columns_reader.key(name)
        entry = _Reader(value, key, r.problems) if isinstance(value, dict) else None
        ch_type = value if entry is None else entry.get("type", str, "", required=True)
        path = "" if entry is None else entry.get("path", str, "", check=_path_problem)
        if entry is not None:
            entry.finish()
        if not _NAME.match(name) or name.startswith("_"):
            r.problems.append(
                f"{key}: column names must be identifiers not starting with '_' "
                "(reserved for meta columns)"
            )
        elif not isinstance(ch_type, str):
            r.problems.append(
                f'{key}: must be a ClickHouse type name like "String", or a table like '
                f'{{ type = "UInt64", path = "user.id" }}; or set columns = "{COLUMNS_FROM_TABLE}"'
            )
        elif ch_type and (text := check_type(ch_type)) is not None:
            r.problems.append(f"{key}: {text}")
        elif ch_type:
            columns.append(ColumnConfig(name, ch_type, path))
    if columns_reader.data == {} and "columns" in r.data:
        columns_reader.problem("", "needs at least one column")
    return columns


def _path_problem(path: str) -> str | None:
    try:
        parse_path(path)
    except ValueError as exc:
        return str(exc)
    return None


def _pipeline(
    r: _Reader, shard_count: int, check_type: Callable[[str], str | None]
) -> PipelineConfig:
    d = PipelineConfig
    from_table = r.data.get("columns") == COLUMNS_FROM_TABLE
    columns = [] if from_table else _columns(r, check_type)
    if from_table:
        r.seen.add("columns")
    meta = r.get(
        "meta_columns",
        list,
        list(d.meta_columns),
        check=lambda v: (
            None
            if all(m in META_COLUMNS for m in v)
            else f"may only contain {', '.join(META_COLUMNS)}; got {v!r}"
        ),
    )
    partitions_reader = r.table("partitions")
    partitions: dict[int, tuple[int, ...]] = {}
    for shard_key, plist in partitions_reader.data.items():
        partitions_reader.seen.add(shard_key)
        key = partitions_reader.key(shard_key)
        if not shard_key.isdigit() or int(shard_key) >= shard_count:
            r.problems.append(f"{key}: must be a shard number below shard_count ({shard_count})")
        elif not isinstance(plist, list) or not all(isinstance(p, int) and p >= 0 for p in plist):
            r.problems.append(f"{key}: must be an array of partition numbers")
        else:
            partitions[int(shard_key)] = tuple(plist)
    if partitions:
        # A shard without a list would read `p % shard_count`: overlapping the lists.
        unlisted = [s for s in range(shard_count) if s not in partitions]
        if unlisted:
            r.problems.append(
                f"{partitions_reader.key(str(unlisted[0]))}: missing; with explicit partition "
                f"lists every shard needs one (shards without: {unlisted})"
            )
        try:
            check_explicit_assignment(partitions)
        except ValueError as exc:
            r.problems.append(f"{partitions_reader.path}: {exc}")
    return r.section(
        PipelineConfig,
        name=r.get("name", str, "", required=True, check=_name_problem),
        topic=r.get("topic", str, "", required=True),
        table=r.get("table", str, "", required=True, check=_name_problem),
        columns=tuple(columns),
        columns_from_table=from_table,
        # _partition and _offset are always kept: exactly-once relies on them.
        meta_columns=tuple(dict.fromkeys([*ALWAYS_META, *meta])),
        partitions=partitions,
        buffer=_buffer(r.table("buffer")),
        wal=r.table("wal").section(PipelineWalConfig),
    )


def _schema_registry(r: _Reader, pipelines: list[PipelineConfig]) -> SchemaRegistryConfig:
    """`[schema_registry]`, required by the pipelines whose writer schemas come from it."""
    s = r.section(SchemaRegistryConfig)
    for url in filter(None, s.url.split(",")):
        if not url.strip().startswith(("http://", "https://")):
            r.problem("url", f"must be http(s)://host:port[/path], got {url.strip()!r}")
    if bool(s.user) != bool(s.password):
        r.problem("user" if s.password else "password", "basic auth needs both user and password")
    # A schema_file already refused (unreadable) must not read as "no schema_file" here.
    refused = {problem.split(": ", 1)[0] for problem in r.problems}
    for i, p in enumerate(pipelines):
        schema_file = p.schema_file or f"pipelines[{i}].schema_file" in refused
        if p.schema_file and p.format is not Format.AVRO:
            r.problems.append(f'pipelines[{i}].schema_file: only format = "avro" reads one')
        elif not s.url and p.format in (Format.AVRO, Format.PROTOBUF) and not schema_file:
            r.problem("url", f"is required: pipeline {p.name!r} reads {p.format} from a registry")
    return s


def _accept_any_type(_: str) -> str | None:
    return None


def parse_config(
    data: Mapping[str, Any],
    source: str = "<config>",
    check_type: Callable[[str], str | None] = _accept_any_type,
) -> Config:
    """Validate a parsed TOML document into a `Config`, or raise `ConfigError` with every problem.

    `check_type` returns a problem text for an unsupported ClickHouse type, else None.
    """
    d = Config
    problems: list[str] = []
    r = _Reader(data, "", problems)
    shard_count = r.positive("shard_count", int, d.shard_count)
    shards = r.get(
        "shards",
        list,
        [],
        required=True,
        check=lambda v: (
            None
            if v and all(isinstance(s, int) and 0 <= s < shard_count for s in v)
            else "must be a non-empty array of shard numbers below shard_count "
            f"({shard_count}); got {v!r}"
        ),
    )
    shard_tuple = tuple(shards or ())
    pipelines_raw = r.get("pipelines", list, [], required=True)
    pipelines = []
    for i, raw in enumerate(pipelines_raw or []):
        if not isinstance(raw, dict):
            problems.append(f"pipelines[{i}]: must be a table ([[pipelines]])")
            continue
        pipelines.append(
            _pipeline(_Reader(raw, f"pipelines[{i}]", problems), shard_count, check_type)
        )
    if r.data.get("pipelines") == []:
        problems.append("pipelines: needs at least one [[pipelines]] table")
    for kind in ("name", "table"):
        values = [getattr(p, kind) for p in pipelines]
        for dup in sorted({v for v in values if values.count(v) > 1 and v}):
            problems.append(f"pipelines: {kind} {dup!r} is used by more than one pipeline")
    config = Config(
        node=r.get(
            "node",
            str,
            "",
            required=True,
            check=lambda v: (
                None
                if _NODE.match(v)
                else f"must be a node id like node-1 ([A-Za-z0-9_.-]), got {v!r}"
            ),
        ),
        shards=shard_tuple,
        shard_count=shard_count,
        data_dir=Path(r.get("data_dir", str, str(d.data_dir))),
        zookeeper=_zookeeper(r.table("zookeeper", required=True)),
        kafka=_kafka(r.table("kafka", required=True)),
        clickhouse=_clickhouse(r.table("clickhouse", required=True), shard_tuple),
        spark=_spark(r.table("spark")),
        server=_server(r.table("server")),
        pipelines=tuple(pipelines),
        schema_registry=_schema_registry(r.table("schema_registry"), pipelines),
        log_level=r.choice("log_level", LogLevel, d.log_level),
        require_tls=r.get("require_tls", bool, d.require_tls),
        source=source,
    )
    _check_advertise(config, problems)
    if config.require_tls:
        problems += [f"require_tls: {hop}" for hop in plain_text_hops(config)]
    r.finish()
    if problems:
        raise ConfigError(source, problems)
    return config


def check_data_dir(config: Config) -> None:
    """Raise `ConfigError` unless `config.data_dir` is a directory this process may write, or
    can be created: its nearest existing ancestor is a writable directory. Run by `run`
    before it touches anything and by `config check` (not by ops commands, which run
    elsewhere)."""
    path = config.data_dir
    existing = next((p for p in (path, *path.parents) if p.exists()), path)
    if not existing.is_dir():
        problem = "is not a directory"
    elif not os.access(existing, os.W_OK | os.X_OK):
        problem = f"is not writable by uid {os.geteuid()}"
    else:
        return
    what = (
        f"{path} {problem}"
        if existing == path
        else f"{path} cannot be created: {existing} {problem}"
    )
    raise ConfigError(config.source or "<config>", [f"data_dir: {what}"])


TLS_KAFKA_PROTOCOLS = ("SSL", "SASL_SSL")
SPARK_RPC_ENCRYPTION = ("spark.network.crypto.enabled", "spark.ssl.rpc.enabled")


def plain_text_hops(config: Config) -> list[str]:
    """Each hop of `config` that would carry data or control in plain text, named with the
    key that makes it so and the fix (what `require_tls = true` refuses)."""
    hops = []
    if not config.zookeeper.tls:
        hops.append("ZooKeeper: zookeeper.tls is false (set it, and connect to secureClientPort)")
    protocol = config.kafka.settings.get("security.protocol", "PLAINTEXT").upper()
    if protocol not in TLS_KAFKA_PROTOCOLS:
        hops.append(
            f'Kafka: kafka.settings."security.protocol" is {protocol} (use '
            f"{' or '.join(TLS_KAFKA_PROTOCOLS)})"
        )
    if not config.clickhouse.secure:
        hops.append("ClickHouse: clickhouse.secure is false (HTTPS to every replica)")
    if not config.server.tls_cert_file:
        hops.append(
            "query servers and the Spark handoff: server.tls_cert_file is not set (HTTPS, "
            "grpc+tls, and the slices executors fetch)"
        )
    if config.schema_registry.url and any(
        u.strip().startswith("http://") for u in config.schema_registry.url.split(",")
    ):
        hops.append("schema registry: schema_registry.url is http:// (use https://)")
    remote = config.spark.remote
    if remote and "use_ssl=true" not in remote.replace(" ", "").lower():
        hops.append("Spark Connect: spark.remote has no ;use_ssl=true")
    if config.spark.master.startswith("spark://") and not any(
        config.spark.conf.get(key, "").lower() == "true" for key in SPARK_RPC_ENCRYPTION
    ):
        hops.append(
            f"Spark RPC: spark.master is a cluster but spark.conf sets neither "
            f"{' nor '.join(SPARK_RPC_ENCRYPTION)} to true"
        )
    return hops


def advertise_warning(config: Config) -> str | None:
    """What is wrong with `server.advertise` as seen from here (it does not resolve), or
    None. A warning, not an error: the host that checks a config may not be the one that
    resolves it, but a name nobody resolves makes `status`, `query` and forwarding fail."""
    host = config.server.advertise
    if not host or _ip(host) is not None:
        return None
    try:
        socket.getaddrinfo(host, None)
    except (OSError, UnicodeError) as exc:
        return (
            f"server.advertise = {host!r} does not resolve here ({exc}): other nodes and "
            "the ops commands reach this node at that name; set the name or address they use"
        )
    return None


def load_config(path: Path, check_type: Callable[[str], str | None] = _accept_any_type) -> Config:
    """Read and validate the TOML file at `path`."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(str(path), [f"cannot read the file: {exc.strerror}"]) from None
    try:
        data = tomllib.loads(raw.decode())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(str(path), [f"not valid TOML: {exc}"]) from None
    return parse_config(data, str(path), check_type)
