"""The config's sections: one frozen dataclass per TOML table, each key declared once, and
the values they hold beyond plain TOML (`Secret`, `Endpoint`).

Every field with a default is read by `ConfigReader.section` (`reader.py`): its TOML key is
the field name, its kind that of the default (numbers must be > 0), its extra rule the
`check` in its metadata (`checked`), a secret's environment variable its `env`. Only keys
with structure of their own (tables of replicas, columns, partitions, settings) have readers
of their own (`loader.py`). An option with a fixed set of values is the enum of the library
that uses it; the config holds the member.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from buffer.limits import QueryLimits, ServerLimits
from chlib.tables import Engine
from hakafka.config.value_checks import (
    LANES_AUTO,
    ca_file_problem,
    checked,
    host_problem,
    name_problem,
    not_negative_problem,
    port_range_problem,
    readable_problem,
    segment_problem,
    transform_problem,
    zk_root_problem,
)
from hakafka.consumer import META_COLUMNS as META_COLUMN_TYPES
from hakafka.consumer import DecodeOptions, Format, OnError, OutOfRange
from hakafka.logs import LogLevel
from wal import FsyncPolicy

# Environment variables that override secrets (the file may leave them out entirely).
ENV_ZK_PASSWORD = "HAKAFKA_ZK_PASSWORD"
ENV_CLICKHOUSE_PASSWORD = "HAKAFKA_CLICKHOUSE_PASSWORD"
ENV_SERVER_TOKEN = "HAKAFKA_SERVER_TOKEN"
ENV_SCHEMA_REGISTRY_PASSWORD = "HAKAFKA_SCHEMA_REGISTRY_PASSWORD"
ENV_KAFKA_PREFIX = "HAKAFKA_KAFKA_"  # HAKAFKA_KAFKA_SASL_PASSWORD -> sasl.password

META_COLUMNS = tuple(name for name, _ in META_COLUMN_TYPES)


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


@dataclass(frozen=True)
class ZooKeeperConfig:
    hosts: str
    root: str = checked("/hakafka/default", zk_root_problem)
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
    ca_file: str = checked("", ca_file_problem)
    cert_file: str = checked("", readable_problem)
    key_file: str = checked("", readable_problem)


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
    database: str = checked("default", name_problem)
    user: str = "default"
    password: Secret = field(default=Secret(""), metadata={"env": ENV_CLICKHOUSE_PASSWORD})
    secure: bool = False
    verify: bool = True
    # PEM CAs that verify ClickHouse's certificate (secure = true); "" = the system's.
    ca_file: str = checked("", ca_file_problem)
    engine: Engine = Engine.MERGE_TREE
    dedup_window: int = 10_000
    insert_timeout: float = 60.0


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
    handoff_host: str = checked("", host_problem)
    # The address the handoff listens on; "" = handoff_host (0.0.0.0 behind NAT).
    handoff_bind: str = checked("", host_problem)
    # The ports the handoff may listen on, "41000-41099" or one port (each flush in progress
    # holds one); "" = one the system picks.
    handoff_ports: str = checked("", port_range_problem)


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
    max_spill_bytes: int = checked(QueryLimits.max_spill_bytes, not_negative_problem)
    # The host other nodes and the ops commands reach this node's servers at; "" = the bind
    # host (see `advertised_host`).
    advertise: str = checked("", host_problem)
    # HTTPS and grpc+tls with this certificate chain and key (both PEM, both or neither).
    tls_cert_file: str = checked("", readable_problem)
    tls_key_file: str = checked("", readable_problem)
    # PEM CAs the clients (forwarding, `hakafka query` and `status`) verify nodes with; ""
    # = the system's. Either TLS key makes them refuse a plain-text node address.
    tls_ca_file: str = checked("", ca_file_problem)


@dataclass(frozen=True)
class BalanceConfig:
    """`[balance]`: how this node hands shards it leads beyond its share to co-replicas
    (docs/DESIGN.md, "Leadership balance")."""

    # false: this node keeps every shard it leads (others may still hand shards to it).
    enabled: bool = True
    # Seconds between two looks; at most one hand-over per look.
    interval: float = 10.0
    # A node up for less than this is given nothing, and a term younger than this is not
    # moved: a node that flaps cannot churn the cluster.
    settle: float = 30.0


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
    segment_bytes: int = checked(64 << 20, segment_problem)


@dataclass(frozen=True)
class SchemaRegistryConfig:
    """`[schema_registry]`: where `avro` (without `schema_file`) and `protobuf` pipelines
    find their writer schemas. `url` may list several, comma-separated."""

    url: str = ""
    user: str = ""
    password: Secret = field(default=Secret(""), metadata={"env": ENV_SCHEMA_REGISTRY_PASSWORD})
    # PEM CAs that verify an https registry's certificate; "" = the system's.
    ca_file: str = checked("", ca_file_problem)
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
    schema_file: str = checked("", readable_problem)
    order_by: str = "(_partition, _offset)"
    partition_by: str = ""
    ttl: str = ""
    meta_columns: tuple[str, ...] = META_COLUMNS
    on_error: OnError = OnError.DEAD_LETTER
    max_message_bytes: int = DecodeOptions.max_message_bytes
    dead_letter_bytes: int = DecodeOptions.dead_letter_bytes
    consumer_group: str = ""  # where checkpoints are mirrored; "" is hakafka.<name>
    transform: str = checked("", transform_problem)
    partitions: Mapping[int, tuple[int, ...]] = field(default_factory=dict)
    # How many lanes read the shard's partitions, each in a process of its own: "auto" (one
    # per partition the shard owns, at most the host's cores and `lanes_max`) or a count
    # (at most one per partition); with 1 the pipeline thread reads, with no process.
    lanes: int | str = LANES_AUTO
    lanes_max: int = 8
    # Pushed batches (the buffer as a write cache): a push is answered once it is in the
    # leader's WAL and `push_acks` other nodes of the shard hold a copy (0: the leader's WAL
    # alone), or once flushed, whichever comes first.
    push_acks: int = checked(1, not_negative_problem)
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
    balance: BalanceConfig = BalanceConfig()
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
