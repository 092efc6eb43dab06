"""The daemon's configuration: one TOML file, validated completely before anything starts.

`load_config(path)` returns a `Config` or raises `ConfigError` listing every problem, each
naming its key (`pipelines[0].buffer.max_rows`) and what is allowed. Unknown keys are errors
(a typo must not silently fall back to a default). Secrets come from files or environment
variables and never appear in `repr()`, logs or config errors; an environment variable set
but empty is an error (it would override a `*_file` and turn auth off). The query servers
fail closed: binding a non-loopback address without a token is an error.

Each key is declared once, as a field of its section's dataclass (`sections.py`): its name
is the TOML key, its default the default, its kind that of the default, and an extra rule
(`value_checks.checked`) or a secret's environment variable (`env`) sits in the field's metadata;
`ConfigReader.section` (`reader.py`) reads a section from those declarations. Only keys with
structure of their own (tables of replicas, columns, partitions, settings) have readers of
their own (`loader.py`); what the node exposes on the network is checked in `network.py`. An
option with a fixed set of values is the enum of the library that uses it
(`wal.FsyncPolicy`, `chlib.tables.Engine`, `hakafka.consumer.Format`/`OnError`/
`OutOfRange`); the config holds the member.
"""

from hakafka.config.loader import (
    DEFAULT_PATH,
    ConfigError,
    check_data_dir,
    load_config,
    parse_config,
)
from hakafka.config.network import advertise_warning, advertised_host, plain_text_hops
from hakafka.config.sections import (
    COLUMNS_FROM_TABLE,
    ENV_CLICKHOUSE_PASSWORD,
    ENV_KAFKA_PREFIX,
    ENV_SCHEMA_REGISTRY_PASSWORD,
    ENV_SERVER_TOKEN,
    ENV_ZK_PASSWORD,
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
    Secret,
    SparkConfig,
    ZooKeeperConfig,
)

__all__ = [
    "COLUMNS_FROM_TABLE",
    "DEFAULT_PATH",
    "ENV_CLICKHOUSE_PASSWORD",
    "ENV_KAFKA_PREFIX",
    "ENV_SCHEMA_REGISTRY_PASSWORD",
    "ENV_SERVER_TOKEN",
    "ENV_ZK_PASSWORD",
    "META_COLUMNS",
    "BalanceConfig",
    "ClickHouseConfig",
    "ColumnConfig",
    "Config",
    "ConfigError",
    "Endpoint",
    "KafkaConfig",
    "NodeServerConfig",
    "PipelineBufferConfig",
    "PipelineConfig",
    "PipelineWalConfig",
    "SchemaRegistryConfig",
    "Secret",
    "SparkConfig",
    "ZooKeeperConfig",
    "advertise_warning",
    "advertised_host",
    "check_data_dir",
    "load_config",
    "parse_config",
    "plain_text_hops",
]
