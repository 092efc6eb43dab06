"""Every operator command against a running two-node cluster on the real local stack."""

from __future__ import annotations

import json
import time
from typing import Any

import pyarrow as pa
import pytest
from kazoo.client import KazooClient
from prometheus_client.parser import text_string_to_metric_families

from devstack.cluster import DaemonNode, LocalCluster, StackEndpoints
from devstack.records import create_topic, produce
from hakafka.coordination import paths
from tests.helpers.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.slow]

SHARDS = [0, 1]
PARTITIONS = 8
HELD = {"min_rows": 1_000_000, "max_age": 300}  # nothing flushes: rows stay in the buffers
TOKEN = "ops-test-token"


def buffered_rows(node: DaemonNode) -> int:
    return sum(
        p["buffer_rows"]
        for s in node.status().get("shards", [])
        if s["role"] == "leader"
        for p in s["pipelines"]
    )


def zk_epochs(hosts: str, root: str) -> list[tuple[bytes, int]]:
    zk = KazooClient(hosts=hosts)
    zk.start(timeout=10)
    try:
        return [
            (data, stat.version)
            for data, stat in (zk.get(f"{root}{paths.epoch(s)}") for s in SHARDS)
        ]
    finally:
        zk.stop()
        zk.close()


def test_every_command_on_a_two_node_cluster(
    *,
    make_cluster: Any,
    stack: StackEndpoints,
    topic_prefix: str,
    zk_root: str,
    ch_client: Any,
    hakafka: Any,
) -> None:
    topic = f"{topic_prefix}_events"
    create_topic(stack.kafka, topic, PARTITIONS)
    # With a bearer token: every command below must find it in the config.
    cluster: LocalCluster = make_cluster(
        {"n1": SHARDS, "n2": SHARDS}, buffer=HELD, server={"token": TOKEN}, lanes=2
    )
    config = str(cluster.nodes["n1"].config_path)

    # init creates the layout and tables; a second run changes nothing.
    first = hakafka("init", "--config", config)
    assert first.code == 0, first.err
    tables_sql = "SELECT name FROM system.tables WHERE database = currentDatabase() ORDER BY name"
    tables = ch_client.query(tables_sql).result_rows
    assert [t[0] for t in tables] == ["events", "events_dead_letter"]
    epochs = zk_epochs(stack.zookeeper, zk_root)
    second = hakafka("init", "--config", config)
    assert second.code == 0, second.err
    recorded = f"zookeeper: shard-wide settings recorded in {zk_root}/settings"
    agreed = f"zookeeper: shard-wide settings agree with {zk_root}/settings"
    assert recorded in first.out and agreed in second.out
    assert second.out.replace(agreed, "") == first.out.replace(
        f"{recorded} (nothing was recorded)", ""
    )
    assert ch_client.query(tables_sql).result_rows == tables
    assert zk_epochs(stack.zookeeper, zk_root) == epochs

    cluster.start()
    leaders = cluster.wait_leaders(SHARDS)

    # Only the health probes and the Prometheus scrape answer without the token.
    n1 = cluster.nodes["n1"]
    # /health answers as soon as the HTTP server runs, /ready once the daemon has started;
    # n2 may have won both elections while n1 was still starting.
    wait_for(lambda: n1.get("/ready", token="")[0] == 200, 30, "n1 to finish starting")
    assert n1.get("/status", token="")[0] == 401
    assert n1.get("/status", token="wrong")[0] == 401
    assert [n1.get(path, token="")[0] for path in ("/health", "/ready", "/metrics")] == [200] * 3

    # failover: shard 1 moves to the other node and reports the time; then, if both shards
    # ended up on one node, a failover without --to splits them again.
    refused = hakafka("failover", "--config", config, "--shard", "1", "--to", "nope")
    assert refused.code == 1 and "nope is not registered" in refused.err
    other = "n2" if leaders[1] == "n1" else "n1"
    moved = hakafka("failover", "--config", config, "--shard", "1", "--to", other, "--json")
    assert moved.code == 0, moved.err
    handover = json.loads(moved.out)
    assert handover["previous"] == leaders[1] and handover["leader"] == other
    assert 0 < handover["seconds"] < 60
    assert cluster.wait_leaders(SHARDS)[1] == other
    target = "n2" if leaders[0] == "n1" else "n1"
    if other != target:
        back = hakafka("failover", "--config", config, "--shard", "1", "--json")
        assert back.code == 0, back.err
        assert json.loads(back.out)["leader"] == target
    same = hakafka("failover", "--config", config, "--shard", "1", "--to", target)
    assert same.code == 1 and f"{target} already leads it" in same.err
    usage = hakafka("failover", "--config", config, "--shard", "7")
    assert usage.code == 2 and "shards 0..1" in usage.err
    leaders = cluster.wait_leaders(SHARDS)
    assert leaders == {0: leaders[0], 1: target}

    produced = produce(stack.kafka, topic, 20_000, partitions=PARTITIONS)
    leader_nodes = {cluster.nodes[n] for n in leaders.values()}
    wait_for(lambda: sum(buffered_rows(n) for n in leader_nodes) == 20_000, 90, "20k buffered rows")
    time.sleep(1.5)  # one more poll of every partition: the lag reads 0 everywhere

    status = hakafka("status", "--config", config, "--json")
    assert status.code == 0, status.err
    view = json.loads(status.out)
    assert view["healthy"] is True
    assert {s["shard"]: s["leader"] for s in view["shards"]} == leaders
    assert all(s["status"] == "consuming" and s["epoch"] >= 1 for s in view["shards"])
    pipelines = {p["shard"]: p for p in view["pipelines"]}
    assert sorted(pipelines) == SHARDS
    for shard, p in pipelines.items():
        assert p["pipeline"] == "events" and p["state"] == "consuming"
        assert p["node"] == leaders[shard]
        assert p["lag"] == {str(q): 0 for q in range(shard, PARTITIONS, 2)}
        # Each lane read every row of its partitions in this term (the produce came after
        # the failovers), and has no lag left.
        mine = list(range(shard, PARTITIONS, 2))
        assert [(lane["lane"], lane["partitions"]) for lane in p["lanes"]] == [
            (0, mine[0::2]),
            (1, mine[1::2]),
        ]
        for lane in p["lanes"]:
            read = sum(1 for q, _ in produced.good if q in lane["partitions"])
            assert (lane["rows"], lane["lag"]) == (read, 0), lane
        assert p["buffer_bytes"] > 0
        assert p["last_flush_at"] is None and p["pending_block"] is None
    assert sum(p["buffer_rows"] for p in pipelines.values()) == 20_000
    nodes = {n["node"]: n for n in view["nodes"]}
    assert sorted(nodes) == ["n1", "n2"]
    for name, n in nodes.items():
        assert n["alive"] is True and n["replacing"] is None
        assert n["http"] == cluster.nodes[name].url
        assert n["flight"] == f"grpc://127.0.0.1:{cluster.nodes[name].flight_port}"

    text = hakafka("status", "--config", config)
    assert text.code == 0, text.err
    for needed in ("SHARD", "LEADER", "LAG (per partition)", "BUFFER ROWS", "REPLACING"):
        assert needed in text.out
    # Shard 0 owns the even partitions; two lanes take every other one of them.
    assert "0 (p0=0 p4=0 | p2=0 p6=0)" in text.out
    # And a table of the lanes: shard 1's second lane reads partitions 3 and 7.
    assert "LANE  PARTITIONS" in text.out
    lane_rows = [line.split() for line in text.out.splitlines() if "p3 p7" in line]
    assert len(lane_rows) == 1 and lane_rows[0][:5] == ["1", "events", "1", "p3", "p7"], lane_rows

    # query: routed to each shard's leader via ZooKeeper.
    counts = hakafka("query", "--config", config, "--json", "SELECT count(*) AS n FROM events")
    assert counts.code == 0, counts.err
    assert [row["n"] for row in json.loads(counts.out)] == [10_000, 10_000]
    assert counts.err == ""
    # In table output each shard's aggregate row says which shard it is.
    labelled = hakafka("query", "--config", config, "SELECT count(*) AS n FROM events")
    assert labelled.code == 0, labelled.err
    assert [line.split() for line in labelled.out.splitlines()] == [
        ["shard", "n"],
        ["0", "10000"],
        ["1", "10000"],
        ["(2", "rows)"],
    ]
    csv = hakafka(
        "query", "--config", config, "--shard", "1", "--format", "csv",
        "SELECT count(*) AS n FROM events WHERE _partition % 2 = 1",
    )  # fmt: skip
    assert csv.code == 0, csv.err
    assert csv.out.splitlines() == ['"n"', "10000"]
    arrow = hakafka(
        "query", "--config", config, "--format", "arrow", "SELECT _partition, _offset FROM events"
    )
    assert arrow.code == 0, arrow.err
    got = pa.ipc.open_stream(arrow.raw).read_all()
    assert set(zip(got["_partition"].to_pylist(), got["_offset"].to_pylist(), strict=True)) == (
        produced.good
    )
    table = hakafka(
        "query", "--config", config, "--shard", "0", "SELECT kind, count(*) AS n FROM events "
        "GROUP BY kind ORDER BY kind",
    )  # fmt: skip
    assert table.code == 0, table.err
    assert table.out.splitlines()[0].split() == ["kind", "n"]
    assert table.out.rstrip().endswith("(3 rows)")
    bad = hakafka("query", "--config", config, "--shard", "0", "SELECT * FROM no_such_table")
    assert bad.code == 1 and "no_such_table" in bad.err

    # wal: the leader's logs hold what it consumed; the other node has none.
    leader = cluster.nodes[leaders[0]]
    verify = hakafka("wal", "verify", "--config", str(leader.config_path))
    assert verify.code == 0, verify.err
    shard0 = [
        line for line in verify.out.splitlines() if line.startswith("OK: ") and "/wal/0/" in line
    ]
    assert len(shard0) == 1 and " 0 record(s)" not in shard0[0], verify.out
    inspect = hakafka("wal", "inspect", "--config", str(leader.config_path), "--pipeline", "events")
    assert inspect.code == 0, inspect.err
    assert "total: " in inspect.out and "record(s)" in inspect.out
    unknown = hakafka("wal", "verify", "--config", config, "--pipeline", "nope")
    assert unknown.code == 2 and "events" in unknown.err

    # /metrics: Prometheus text that prometheus-client parses, with what operators graph.
    code, body = leader.get("/metrics")
    assert code == 200
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
    }
    by_name: dict[str, float] = {}
    for (name, _labels), value in samples.items():
        by_name[name] = by_name.get(name, 0.0) + value
    assert by_name["hakafka_consumed_rows_total"] == 10_000
    assert by_name["hakafka_consumed_bytes_total"] > 10_000 * 20
    assert by_name["hakafka_wal_bytes_total"] > 0 and by_name["hakafka_wal_syncs_total"] > 0
    # the gauges agree with /status once consumption is done
    (buffered,) = (
        p for s in leader.status()["shards"] if s["role"] == "leader" for p in s["pipelines"]
    )
    assert by_name["hakafka_buffer_rows"] == buffered["buffer_rows"] == 10_000
    assert by_name["hakafka_buffer_bytes"] == buffered["buffer_bytes"] > 0
    assert by_name["hakafka_leader"] == 1 and by_name["hakafka_epoch"] >= 1
    lag = {k[1]: v for k, v in samples.items() if k[0] == "hakafka_kafka_lag"}
    shard0_lag = {dict(k)["partition"]: v for k, v in lag.items() if dict(k)["shard"] == "0"}
    assert shard0_lag == {"0": 0, "2": 0, "4": 0, "6": 0}
    assert leader.get("/health")[0] == 200 and leader.get("/ready")[0] == 200

    # node replace --start on a leader moves its shard and says where; --done clears it.
    victim = leaders[1]
    start = hakafka(
        "node", "replace", victim, "--config", config, "--start", "--reason", "disk swap", "--json"
    )
    assert start.code == 0, start.err
    replaced = json.loads(start.out)
    assert [(m["shard"], m["previous"]) for m in replaced["moved"]] == [(1, victim)]
    assert replaced["moved"][0]["leader"] == leaders[0]
    assert cluster.wait_leaders(SHARDS) == {0: leaders[0], 1: leaders[0]}
    blocked = hakafka("failover", "--config", config, "--shard", "0", "--to", victim)
    assert blocked.code == 1 and "under replacement" in blocked.err and "disk swap" in blocked.err
    flagged = json.loads(hakafka("status", "--config", config, "--json").out)
    marks = {n["node"]: n["replacing"] for n in flagged["nodes"]}
    assert marks[victim]["reason"] == "disk swap" and marks[leaders[0]] is None
    done = hakafka("node", "replace", victim, "--config", config, "--done")
    assert done.code == 0 and "no longer under replacement" in done.out
    again = hakafka("node", "replace", victim, "--config", config, "--done")
    assert again.code == 0 and "was not under replacement" in again.out
    cleared = json.loads(hakafka("status", "--config", config, "--json").out)
    assert all(n["replacing"] is None for n in cleared["nodes"])
