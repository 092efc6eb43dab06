"""Config files the tests parse: a good daemon config to vary (`GOOD`, with `write` and
`problems_of`), the one-pipeline config the shard-wide settings record is built from
(`SETTINGS_BASE`, varied through `config`), and the smallest config document (`minimal`)."""

from __future__ import annotations

import textwrap
import tomllib
from pathlib import Path
from typing import Any

import pytest

from hakafka.config import Config, ConfigError, load_config, parse_config

# A valid two-shard config with secrets in it (Kafka SASL, ClickHouse password).
GOOD = """
node = "node-1"
shards = [0, 1]
shard_count = 2
data_dir = "/tmp/hakafka-data"

[zookeeper]
hosts = "127.0.0.1:2181"
root = "/hakafka/test"
session_timeout = 4

[kafka]
bootstrap = "127.0.0.1:9092"
[kafka.settings]
"security.protocol" = "SASL_SSL"
"sasl.password" = "kafka-secret"

[clickhouse]
database = "ingest"
password = "ch-secret"
engine = "ReplicatedMergeTree"
[clickhouse.replicas.0]
node-1 = "127.0.0.1:8123"
node-2 = "http://127.0.0.1:8124"
[clickhouse.replicas.1]
node-1 = "127.0.0.1:8123"

[[pipelines]]
name = "events"
topic = "events"
table = "events"
on_error = "dead_letter"
[pipelines.columns]
id = "Int64"
name = "String"
[pipelines.buffer]
min_rows = 10
max_rows = 100
[pipelines.wal]
fsync = "always"
"""


def write(tmp_path: Path, text: str) -> Path:
    """`text` (dedented) written as `tmp_path`/hakafka.toml; its path."""
    path = tmp_path / "hakafka.toml"
    path.write_text(textwrap.dedent(text))
    return path


def problems_of(tmp_path: Path, text: str) -> list[str]:
    """The problems `load_config` reports for the config `text`; fails if it loads."""
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, text))
    return err.value.problems


# One pipeline, two shards, replicas on other hosts: the base of the settings-record tests.
SETTINGS_BASE = """
node = "n1"
shards = [0, 1]
shard_count = 2

[zookeeper]
hosts = "127.0.0.1:2181"

[kafka]
bootstrap = "127.0.0.1:9092"

[clickhouse]
engine = "MergeTree"
[clickhouse.replicas.0]
n1 = "10.0.0.1:8123"
[clickhouse.replicas.1]
n1 = "10.0.0.2:8123"

[spark]
rows_per_task = 1000

[server]
# The replicas below are on other hosts: this node must say where it is reached.
advertise = "ch-node-1"

[[pipelines]]
name = "orders"
topic = "orders"
table = "orders"
on_error = "dead_letter"
[pipelines.columns]
id = "Int64"
amount = "Float64"
[pipelines.buffer]
max_age = 50
"""


def edited(text: str, replace: dict[str, str]) -> str:
    """`text` with each key of `replace` replaced by its value; each key must occur once."""
    for old, new in replace.items():
        assert text.count(old) == 1, f"{old!r} is not in the config once"
        text = text.replace(old, new)
    return text


def config(replace: dict[str, str] | None = None, text: str = SETTINGS_BASE) -> Config:
    """The config `text` with each key of `replace` replaced by its value."""
    return parse_config(tomllib.loads(edited(text, replace or {})), "<test>")


NOWHERE = "127.0.0.1:1"  # an address nothing listens on: the config only names it


def minimal(**keys: Any) -> dict[str, Any]:
    """The smallest config document that parses, with the top-level `keys` set over it: node
    `n1` leading shard 0, ZooKeeper, Kafka and its ClickHouse replica at `NOWHERE`, and one
    pipeline `p` (topic `t` into table `p`, one column `v` Int64)."""
    return {
        "node": "n1",
        "shards": [0],
        "zookeeper": {"hosts": NOWHERE},
        "kafka": {"bootstrap": NOWHERE},
        "clickhouse": {"replicas": {"0": {"n1": NOWHERE}}},
        "pipelines": [{"name": "p", "topic": "t", "table": "p", "columns": {"v": "Int64"}}],
    } | keys
