"""Where a flush's slice handoff listens and what it tells Spark's tasks, per cluster mode:
`[spark] handoff_host`/`handoff_bind` through `SparkSettings` into the session's conf."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pytest

from hakafka.config import load_config
from hakafka.settings import spark_settings
from spark_bridge.handoff import SliceHandoff
from spark_bridge.runtime import (
    CONNECT_MODE_ENV,
    HANDOFF_BIND_CONF,
    HANDOFF_HOST_CONF,
    SparkRuntime,
    SparkSettings,
    SparkStartError,
    handoff_address,
)
from tests.helpers.configs import GOOD, problems_of, write

# What a driver alone may be given: a Spark Connect server refuses these from a session.
DRIVER_KEYS = {"spark.ui.enabled", "spark.driver.memory", "spark.python.worker.reuse"}


def session_with(conf: dict[str, str]) -> Any:
    """Stands for a SparkSession: only `conf.get(key, default)` is read."""
    return SimpleNamespace(
        conf=SimpleNamespace(get=lambda key, default=None: conf.get(key, default))
    )


def test_spark_connect_handoff_defaults_to_loopback_and_sends_no_driver_settings() -> None:
    conf = SparkSettings(remote="sc://127.0.0.1:15002").spark_conf()
    assert conf[HANDOFF_HOST_CONF] == "127.0.0.1"
    assert HANDOFF_BIND_CONF not in conf
    assert not DRIVER_KEYS & conf.keys()
    given = SparkSettings(
        remote="sc://spark:15002", handoff_host="10.0.0.5", handoff_bind="0.0.0.0"
    )
    conf = given.spark_conf()
    assert (conf[HANDOFF_HOST_CONF], conf[HANDOFF_BIND_CONF]) == ("10.0.0.5", "0.0.0.0")
    assert handoff_address(session_with(conf)) == ("10.0.0.5", "0.0.0.0")


@pytest.mark.parametrize("master", ["local[2]", "spark://127.0.0.1:7077", "spark://localhost:1"])
def test_a_master_on_loopback_keeps_the_driver_and_handoff_there(master: str) -> None:
    conf = SparkSettings(master=master).spark_conf()
    assert conf["spark.driver.host"] == conf["spark.driver.bindAddress"] == "127.0.0.1"
    assert conf.keys() >= DRIVER_KEYS
    assert handoff_address(session_with(conf)) == ("127.0.0.1", "127.0.0.1")


def test_a_remote_master_hands_off_at_the_drivers_host_unless_configured() -> None:
    conf = SparkSettings(master="spark://spark-master:7077").spark_conf()
    assert "spark.driver.host" not in conf and HANDOFF_HOST_CONF not in conf
    # Spark sets the driver's host when the session starts: the handoff follows it.
    assert handoff_address(session_with({**conf, "spark.driver.host": "node-3"})) == (
        "node-3",
        "node-3",
    )
    conf = SparkSettings(master="spark://spark-master:7077", handoff_host="node-3.lan").spark_conf()
    assert handoff_address(session_with({**conf, "spark.driver.host": "10.1.1.3"})) == (
        "node-3.lan",
        "node-3.lan",
    )


def test_the_handoff_listens_on_bind_and_tells_tasks_its_host() -> None:
    table = pa.table({"v": [1, 2, 3]})
    with SliceHandoff("127.0.0.1", [table], bind="0.0.0.0") as handoff:
        assert handoff.source.location.startswith("grpc://127.0.0.1:")
        batches = list(handoff.source.fetch(0))
    assert pa.Table.from_batches(batches).equals(table)


def test_config_requires_handoff_host_with_a_connect_server_on_another_host(
    tmp_path: Path,
) -> None:
    remote = GOOD + '\n[spark]\nremote = "sc://spark-connect.lan:15002/;token=s3cret"\n'
    (problem,) = problems_of(tmp_path, remote)
    assert problem.startswith("spark.handoff_host: is required with a Spark Connect server on ")
    assert "spark-connect.lan" in problem and "s3cret" not in problem
    settings = spark_settings(
        load_config(write(tmp_path, remote + 'handoff_host = "10.0.0.5"\nhandoff_bind = "0.0.0.0"'))
    )
    assert (settings.handoff_host, settings.handoff_bind) == ("10.0.0.5", "0.0.0.0")
    local = GOOD + '\n[spark]\nremote = "sc://127.0.0.1:15002"\n'
    assert spark_settings(load_config(write(tmp_path, local))).handoff_host is None
    (bad,) = problems_of(tmp_path, GOOD + '\n[spark]\nhandoff_host = "grpc://x:1"\n')
    assert bad.startswith("spark.handoff_host: must be a host name or IP address")


def test_a_failed_spark_connect_start_leaves_the_process_in_classic_mode(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(CONNECT_MODE_ENV, raising=False)
    with pytest.raises(SparkStartError):
        SparkRuntime(SparkSettings(remote="sc://:15002/;token=abc123")).start()
    # Else the next classic session of this process (or of its children) is a Connect one.
    assert CONNECT_MODE_ENV not in os.environ
