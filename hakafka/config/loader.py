"""Reading the config file: `load_config` (TOML) and `parse_config` (a parsed document) return
a `Config` or raise `ConfigError` listing every problem; one reader per section with structure
of its own, and the checks across keys of a section; `check_data_dir` before a daemon starts."""

from __future__ import annotations

import os
import re
import ssl
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from chlib.connection import is_loopback
from chlib.tables import Engine
from hakafka.config.network import check_advertise, plain_text_hops, same_address
from hakafka.config.reader import ConfigReader, parse_endpoint
from hakafka.config.sections import (
    COLUMNS_FROM_TABLE,
    ENV_KAFKA_PREFIX,
    ENV_SERVER_TOKEN,
    META_COLUMNS,
    BalanceConfig,
    ClickHouseConfig,
    ColumnConfig,
    Config,
    Endpoint,
    KafkaConfig,
    NodeServerConfig,
    PipelineBufferConfig,
    PipelineConfig,
    PipelineWalConfig,
    SchemaRegistryConfig,
    SparkConfig,
    ZooKeeperConfig,
)
from hakafka.config.value_checks import NAME, lanes_problem, name_problem
from hakafka.consumer import ALWAYS_META, MANAGED_SETTINGS, Format, check_explicit_assignment
from hakafka.consumer.schema import parse_path
from hakafka.logs import LogLevel

DEFAULT_PATH = Path("/etc/hakafka/hakafka.toml")

_NODE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")


class ConfigError(ValueError):
    """The configuration is invalid; `problems` lists each one as `key: what is wrong`."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = problems
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"invalid configuration {source}:\n{lines}")


def _zookeeper(r: ConfigReader) -> ZooKeeperConfig:
    z = r.section(ZooKeeperConfig, hosts=r.get("hosts", str, "", required=True))
    if z.auth_password and not z.auth_user:
        r.problem("auth_user", "is required when a ZooKeeper password is set")
    if not z.tls:
        for key in ("ca_file", "cert_file", "key_file"):
            if getattr(z, key):
                r.problem(key, "is set but zookeeper.tls is false: set tls = true to use it")
    _check_key_pair(r, z, "cert_file", "key_file")
    return z


def _check_key_pair(r: ConfigReader, section: object, cert_key: str, key_key: str) -> None:
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


def _kafka(r: ConfigReader) -> KafkaConfig:
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


def _clickhouse(r: ConfigReader, shards: tuple[int, ...]) -> ClickHouseConfig:
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
    # tables' UUIDs do, so `init` and each term check it (`chlib.tables.check_one_table`).
    engine = r.choice("engine", Engine, d.engine)
    ch = r.section(ClickHouseConfig, replicas=replicas, engine=engine)
    if ch.ca_file and not (ch.secure and ch.verify):
        r.problem(
            "ca_file", "verifies ClickHouse's certificate: needs secure = true, verify = true"
        )
    return ch


def _spark(r: ConfigReader) -> SparkConfig:
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


def _server(r: ConfigReader) -> NodeServerConfig:
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
    if same_address(s.http, s.flight):
        r.problem(
            "flight",
            f"{s.flight} is also server.http's address ({s.http}): the two servers cannot "
            "share a port; give each its own",
        )
    return s


def _buffer(r: ConfigReader) -> PipelineBufferConfig:
    b = r.section(PipelineBufferConfig)
    for low, high in (("min_rows", "max_rows"), ("min_bytes", "max_bytes"), ("min_age", "max_age")):
        if getattr(b, low) > getattr(b, high):
            r.problem(low, f"must not exceed {high} ({getattr(b, low)} > {getattr(b, high)})")
    if b.limit_bytes < b.max_bytes:
        r.problem("limit_bytes", f"must be at least max_bytes ({b.limit_bytes} < {b.max_bytes})")
    return b


def _columns(r: ConfigReader, check_type: Callable[[str], str | None]) -> list[ColumnConfig]:
    """`[pipelines.columns]`: `name = "Type"` or `name = { type = "Type", path = "a.b" }`."""
    columns_reader = r.table("columns", required=True)
    columns = []
    for name, value in columns_reader.data.items():
        columns_reader.seen.add(name)
        key = columns_reader.key(name)
        entry = ConfigReader(value, key, r.problems) if isinstance(value, dict) else None
        ch_type = value if entry is None else entry.get("type", str, "", required=True)
        path = "" if entry is None else entry.get("path", str, "", check=_path_problem)
        if entry is not None:
            entry.finish()
        if not NAME.match(name) or name.startswith("_"):
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
    r: ConfigReader, shard_count: int, check_type: Callable[[str], str | None]
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
        name=r.get("name", str, "", required=True, check=name_problem),
        topic=r.get("topic", str, "", required=True),
        table=r.get("table", str, "", required=True, check=name_problem),
        columns=tuple(columns),
        columns_from_table=from_table,
        # _partition and _offset are always kept: exactly-once relies on them.
        meta_columns=tuple(dict.fromkeys([*ALWAYS_META, *meta])),
        partitions=partitions,
        lanes=r.get("lanes", (int, str), d.lanes, check=lanes_problem),
        buffer=_buffer(r.table("buffer")),
        wal=r.table("wal").section(PipelineWalConfig),
    )


def _schema_registry(r: ConfigReader, pipelines: list[PipelineConfig]) -> SchemaRegistryConfig:
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
    r = ConfigReader(data, "", problems)
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
            _pipeline(ConfigReader(raw, f"pipelines[{i}]", problems), shard_count, check_type)
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
        balance=r.table("balance").section(BalanceConfig),
        schema_registry=_schema_registry(r.table("schema_registry"), pipelines),
        log_level=r.choice("log_level", LogLevel, d.log_level),
        require_tls=r.get("require_tls", bool, d.require_tls),
        source=source,
    )
    check_advertise(config, problems)
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
