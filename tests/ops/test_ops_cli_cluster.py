"""Every operator command against a running two-node cluster on the real local stack."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest
from kazoo.client import KazooClient
from prometheus_client.parser import text_string_to_metric_families

from hakafka.devstack.cluster import DaemonNode, LocalCluster, StackEndpoints
from hakafka.devstack.records import create_topic, produce, tally

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.slow]

SHARDS = [0, 1]
PARTITIONS = 8
HELD = {"min_rows": 1_000_000, "max_age": 300}  # nothing flushes: rows stay in the buffers


def wait_for(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.5)


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
            for data, stat in (zk.get(f"{root}/shards/{s}/epoch") for s in SHARDS)
        ]
    finally:
        zk.stop()
        zk.close()


def test_init_status_query_and_wal(
    make_cluster: Any,
    stack: StackEndpoints,
    topic_prefix: str,
    zk_root: str,
    ch_client: Any,
    hakafka: Any,
) -> None:
    topic = f"{topic_prefix}_events"
    create_topic(stack.kafka, topic, PARTITIONS)
    cluster: LocalCluster = make_cluster({"n1": SHARDS, "n2": SHARDS}, buffer=HELD)
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
    assert second.out == first.out
    assert ch_client.query(tables_sql).result_rows == tables
    assert zk_epochs(stack.zookeeper, zk_root) == epochs

    cluster.start()
    leaders = cluster.wait_leaders(SHARDS)
    produced = produce(stack.kafka, topic, 20_000, partitions=PARTITIONS)
    leader_nodes = {cluster.nodes[n] for n in leaders.values()}
    wait_for(
        lambda: sum(buffered_rows(n) for n in leader_nodes) == 20_000, 90, "20k buffered rows"
    )
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
    assert "0 (p0=0 p2=0 p4=0 p6=0)" in text.out

    # query: routed to each shard's leader via ZooKeeper.
    counts = hakafka("query", "--config", config, "--json", "SELECT count(*) AS n FROM events")
    assert counts.code == 0, counts.err
    assert [row["n"] for row in json.loads(counts.out)] == [10_000, 10_000]
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
    assert verify.out.count("OK: ") == len([s for s, n in leaders.items() if n == leader.name])
    inspect = hakafka("wal", "inspect", "--config", str(leader.config_path), "--pipeline", "events")
    assert inspect.code == 0, inspect.err
    assert "total: " in inspect.out and "record(s)" in inspect.out
    unknown = hakafka("wal", "verify", "--config", config, "--pipeline", "nope")
    assert unknown.code == 2 and "events" in unknown.err
