"""A config re-read (SIGHUP, `systemctl reload`): live keys applied, the rest refused by key."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import pytest

from devstack.cluster import LocalCluster
from devstack.process import wait_until
from devstack.records import create_topic, produce
from hakafka.config import load_config
from hakafka.daemon.reload import RESTART, SHARD_WIDE, Refusal, plan_reload
from hakafka.logs import LogLevel
from tests.commands import edit, hakafka
from tests.helpers.configs import GOOD
from tests.helpers.logs import events


def config_of(tmp_path: Path, name: str, text: str) -> Any:
    path = tmp_path / name
    path.write_text(text)
    return load_config(path)


def test_live_keys_are_applied_and_the_others_refused_by_key(tmp_path: Path) -> None:
    running = config_of(tmp_path, "a.toml", GOOD)
    changed = (
        GOOD.replace("max_rows = 100", "max_rows = 5000\nmax_age = 20")
        .replace(
            'data_dir = "/tmp/hakafka-data"', 'data_dir = "/tmp/elsewhere"\nlog_level = "debug"'
        )
        .replace("shards = [0, 1]", "shards = [0]")
        .replace('topic = "events"', 'topic = "orders"')
        .replace('password = "ch-secret"', 'password = "ch-other"')
        .replace(
            "[clickhouse]", '[server]\ntoken = "new-token-value"\nquery_timeout = 3\n\n[clickhouse]'
        )
    )
    plan = plan_reload(running, config_of(tmp_path, "b.toml", changed))
    assert sorted(plan.applied) == [
        "log_level",
        "pipelines.events.buffer.max_age",
        "pipelines.events.buffer.max_rows",
        "server.query_timeout",
        "server.token",
    ]
    assert sorted(plan.refused, key=lambda r: r.key) == [
        Refusal("clickhouse.password", RESTART),
        Refusal("data_dir", RESTART),
        Refusal("pipelines.events.topic", SHARD_WIDE),
        Refusal("shards", RESTART),
    ]
    effective = plan.config
    assert effective.pipelines[0].buffer.max_rows == 5000
    assert effective.pipelines[0].topic == "events"  # refused: the running value stays
    assert effective.shards == (0, 1) and effective.log_level is LogLevel.DEBUG
    assert effective.server.token.value == "new-token-value"
    assert effective.clickhouse.password.value == "ch-secret"
    assert "ch-other" not in repr(plan) and "new-token-value" not in repr(plan)


def test_nothing_changed_plans_nothing(tmp_path: Path) -> None:
    running = config_of(tmp_path, "a.toml", GOOD)
    plan = plan_reload(running, config_of(tmp_path, "b.toml", GOOD))
    assert (plan.applied, plan.refused, plan.config) == ((), (), running)


@pytest.mark.integration
@pytest.mark.spark
def test_sighup_applies_a_threshold_and_refuses_a_topology_change(
    make_cluster: Any, stack: Any, topic_prefix: str, ch_client: Any
) -> None:
    topic = f"{topic_prefix}_events"
    create_topic(stack.kafka, topic, 2)
    # Thresholds no test waits out: nothing is flushed until the reload lowers max_age.
    cluster: LocalCluster = make_cluster(
        {"n1": [0, 1]},
        buffer={
            "min_rows": 10**9,
            "max_rows": 10**9,
            "min_bytes": 1,
            "min_age": 3600,
            "max_age": 3600,
        },
    )
    node = cluster.nodes["n1"]
    assert hakafka("init", "--config", str(node.config_path)).code == 0
    cluster.start()
    cluster.wait_leaders([0, 1])
    produce(stack.kafka, topic, 500, partitions=2)
    time.sleep(3)
    assert int(ch_client.command("SELECT count() FROM events")) == 0
    edit(node.config_path, r"^min_age = 3600$", "min_age = 0.5")
    edit(node.config_path, r"^max_age = 3600$", "max_age = 1")
    edit(node.config_path, r"^shards = \[0, 1\]$", "shards = [0]")
    node.kill(signal.SIGHUP)
    wait_until(
        lambda: bool(events(node, "config.reloaded") or events(node, "config.reload_failed")),
        timeout=30,
        what="the reload",
    )
    assert events(node, "config.reload_failed") == []
    (reloaded,) = events(node, "config.reloaded")
    wait_until(
        lambda: int(ch_client.command("SELECT count() FROM events")) == 500,
        timeout=120,
        what="the rows flushed at the reloaded max_age",
    )
    assert reloaded["applied"] == [
        "pipelines.events.buffer.min_age",
        "pipelines.events.buffer.max_age",
    ]
    (refused,) = events(node, "config.reload_refused")
    assert (refused["key"], refused["reason"]) == ("shards", RESTART)
    assert cluster.leaders() == {0: "n1", 1: "n1"}  # the refused change did not apply
