"""`hakafka init` records the shard-wide settings, `config check --cluster` shows how a config
differs from them, `init --update` records compatible changes only and `init --replace` any
change, but only on a stopped, drained cluster: the real `hakafka` command against the real
ZooKeeper and ClickHouse of the local stack (no daemon runs)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kazoo.client import KazooClient

from devstack.cluster import LocalCluster, StackEndpoints
from hakafka.coordination import NodeInfo, PendingIntent, paths
from tests.commands import edit

pytestmark = [pytest.mark.integration]

SHARDS = [0, 1]


def recorded(stack: StackEndpoints, zk_root: str) -> dict[str, Any]:
    """The JSON of `<root>/settings`, read with a plain ZooKeeper client."""
    zk = KazooClient(hosts=stack.zookeeper)
    zk.start(timeout=10)
    try:
        data, _ = zk.get(f"{zk_root}{paths.SETTINGS}")
    finally:
        zk.stop()
        zk.close()
    value: dict[str, Any] = json.loads(data)
    return value


def test_init_records_and_config_check_cluster_shows_the_drift(
    make_cluster: Any, stack: StackEndpoints, zk_root: str, hakafka: Any
) -> None:
    cluster: LocalCluster = make_cluster({"n1": SHARDS, "n2": SHARDS})
    n1, n2 = (cluster.nodes[n].config_path for n in ("n1", "n2"))
    edit(n2, r'^on_error = "dead_letter"$', 'on_error = "skip"')

    nothing = hakafka("config", "check", "--cluster", str(n1))
    assert nothing.code == 0, nothing.err
    assert f"{zk_root}/settings: nothing recorded yet" in nothing.out

    first = hakafka("init", "--config", str(n1))
    assert first.code == 0, first.err
    assert (
        f"zookeeper: shard-wide settings recorded in {zk_root}/settings (nothing was recorded)"
    ) in first.out
    assert "agree" not in first.out
    record = recorded(stack, zk_root)
    assert record["shard_count"] == 2 and record["engine"] == "MergeTree"
    assert record["pipelines"]["events"]["on_error"] == "dead_letter"
    assert record["endpoints"] == {"0": [stack.clickhouse], "1": [stack.clickhouse]}

    again = hakafka("init", "--config", str(n1))
    assert again.code == 0, again.err
    assert f"zookeeper: shard-wide settings agree with {zk_root}/settings" in again.out

    same = hakafka("config", "check", "--cluster", str(n1))
    assert same.code == 0, same.err
    assert "agree with the record" in same.out

    drift = hakafka("config", "check", "--cluster", str(n2))
    assert drift.code == 1, drift.out + drift.err
    assert f"{zk_root}/settings: 1 shard-wide settings differ from the record:" in drift.out
    assert (
        '  - pipeline "events": on_error: recorded "dead_letter", this config "skip" '
        "(incompatible; to migrate: stop hakafka on every node"
    ) in drift.out

    # init refuses it, --update too (incompatible), and the record stays as it was.
    for args in ([], ["--update"]):
        refused = hakafka("init", "--config", str(n2), *args)
        assert refused.code == 1, refused.out
        assert 'pipeline "events": on_error: recorded "dead_letter", this config "skip"' in (
            refused.err
        )
        assert "hakafka init --replace" in refused.err
    assert recorded(stack, zk_root) == record


def test_update_records_an_added_nullable_column_and_adds_it_to_the_tables(
    make_cluster: Any, stack: StackEndpoints, zk_root: str, ch_client: Any, hakafka: Any
) -> None:
    cluster: LocalCluster = make_cluster({"n1": SHARDS})
    config = cluster.nodes["n1"].config_path
    assert hakafka("init", "--config", str(config)).code == 0
    edit(config, r'^amount = "Nullable\(Float64\)"$', '\\g<0>\nnote = "Nullable(String)"')

    plain = hakafka("init", "--config", str(config))
    assert plain.code == 1
    assert (
        'pipeline "events": columns.note: recorded (none), this config "Nullable(String)" '
        "(compatible)" in plain.err
    )
    assert "every difference is compatible: record them with `hakafka init --update`" in plain.err

    updated = hakafka("init", "--update", "--config", str(config))
    assert updated.code == 0, updated.err
    assert f"zookeeper: recorded in {zk_root}/settings: " in updated.out
    columns = recorded(stack, zk_root)["pipelines"]["events"]["columns"]
    assert columns == [
        ["id", "Int64"],
        ["kind", "LowCardinality(String)"],
        ["amount", "Nullable(Float64)"],
        ["note", "Nullable(String)"],
    ]
    table = ch_client.query(
        "SELECT name, type FROM system.columns WHERE database = currentDatabase() "
        "AND table = 'events' ORDER BY position"
    ).result_rows
    assert [tuple(c) for c in table[:4]] == [tuple(c) for c in columns]
    assert hakafka("config", "check", "--cluster", str(config)).code == 0
    again = hakafka("init", "--config", str(config))
    assert again.code == 0, again.err
    assert "added column" not in again.out


def test_mergetree_with_two_servers_for_a_shard_across_two_nodes_is_refused(
    make_cluster: Any, stack: StackEndpoints, zk_root: str, hakafka: Any
) -> None:
    # Each node's config names one ClickHouse server per shard (each passes the loader's
    # per-node check); n1 says 127.0.0.1, n2 says localhost: two servers for MergeTree.
    cluster: LocalCluster = make_cluster({"n1": SHARDS, "n2": SHARDS})
    n1, n2 = (cluster.nodes[n].config_path for n in ("n1", "n2"))
    edit(n1, r'^"n2" = .*\n', "", count=2)
    edit(n2, r'^"n1" = .*\n', "", count=2)
    edit(n2, r'^"n2" = "127\.0\.0\.1:', '"n2" = "localhost:', count=2)
    for config in (n1, n2):
        assert hakafka("config", "check", str(config)).code == 0
    assert hakafka("init", "--config", str(n1)).code == 0

    check = hakafka("config", "check", "--cluster", str(n2))
    assert check.code == 1, check.out + check.err
    port = stack.clickhouse.rsplit(":", 1)[1]
    for shard in SHARDS:
        assert (
            f'  - clickhouse.replicas.{shard}: recorded ["127.0.0.1:{port}"], this config '
            f'["localhost:{port}"] (incompatible; to migrate: MergeTree keeps its '
            "deduplication log per server"
        ) in check.out
    refused = hakafka("init", "--config", str(n2))
    assert refused.code == 1 and "clickhouse.replicas.0" in refused.err
    assert recorded(stack, zk_root)["endpoints"] == {
        "0": [f"127.0.0.1:{port}"],
        "1": [f"127.0.0.1:{port}"],
    }


def test_replace_records_an_incompatible_change_only_on_a_stopped_drained_cluster(
    make_cluster: Any, stack: StackEndpoints, zk_root: str, hakafka: Any
) -> None:
    cluster: LocalCluster = make_cluster({"n1": SHARDS, "n2": SHARDS})
    n1, n2 = (cluster.nodes[n].config_path for n in ("n1", "n2"))
    edit(n2, r'^on_error = "dead_letter"$', 'on_error = "skip"')
    assert hakafka("init", "--config", str(n1)).code == 0
    pending = f"{zk_root}{paths.pending(1, 'events')}"
    node = NodeInfo(host="h", http="http://h:1", flight="grpc://h:2", pid=1, version="t")
    intent = PendingIntent(block_id="b1", ranges={"t": {1: (0, 10)}}, epoch=1)
    zk = KazooClient(hosts=stack.zookeeper)
    zk.start(timeout=10)
    try:
        # A running node (its registration is ephemeral) refuses --replace ...
        zk.create(f"{zk_root}{paths.node('n9')}", node.encode(), ephemeral=True)
        running = hakafka("init", "--replace", "--config", str(n2))
        assert running.code == 1 and "--replace refused: hakafka runs on n9" in running.err
        zk.delete(f"{zk_root}{paths.node('n9')}")
        # ... and so does a block in doubt, whose re-flush needs the recorded settings.
        zk.create(pending, intent.encode(), makepath=True)
        drained = hakafka("init", "--replace", "--config", str(n2))
        assert drained.code == 1
        assert "--replace refused: a block is pending in shard 1 pipeline events" in drained.err
        zk.delete(pending)
    finally:
        zk.stop()
        zk.close()
    assert recorded(stack, zk_root)["pipelines"]["events"]["on_error"] == "dead_letter"

    replaced = hakafka("init", "--replace", "--config", str(n2))
    assert replaced.code == 0, replaced.err
    assert (
        f'zookeeper: replaced in {zk_root}/settings: pipeline "events": on_error: recorded '
        '"dead_letter", this config "skip" (incompatible'
    ) in replaced.out
    assert recorded(stack, zk_root)["pipelines"]["events"]["on_error"] == "skip"
    assert hakafka("config", "check", "--cluster", str(n2)).code == 0
    assert hakafka("config", "check", "--cluster", str(n1)).code == 1
