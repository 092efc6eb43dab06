"""read_table with include_buffer on a running two-shard cluster, each shard on its own
ClickHouse server, while data flows from the topic and from a push writer per shard: every
(partition, offset) once, each pushed batch whole, as many rows as ClickHouse holds below
the checkpoint plus the buffers above it."""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from buffer.push_client import Pusher
from chlib import Cluster
from chlib.cluster import committed_condition
from devstack.clickhouse import ClickHouseService
from devstack.cluster import LocalCluster, PipelineSpec, StackEndpoints
from devstack.kafka import KafkaBroker
from devstack.process import wait_until
from devstack.records import EVENT_COLUMNS, create_topic, produce
from devstack.spark_cluster import SparkConnectServer
from devstack.zookeeper import ZooKeeperEnsemble
from hakafka.config import load_config
from hakafka.ops.cluster import connect
from hakafka.ops.cluster_view import LeaderBuffers, cluster_view
from spark_bridge.reader import above_checkpoint, read_table

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.slow]

PARTITIONS = 4
PUSH_ROWS = 50
FLOWING = {"min_rows": 2000, "max_rows": 100_000, "min_bytes": 1, "min_age": 1, "max_age": 2}


@dataclass
class Recorded:
    """`LeaderBuffers` that keeps what it answered, to count both sides afterwards."""

    live: LeaderBuffers
    buffered: pa.Table | None = None
    committed: Mapping[int, int] = field(default_factory=dict)

    def rows(self) -> pa.Table:
        self.buffered = self.live.rows()
        return self.buffered

    def checkpoint(self) -> Mapping[int, int]:
        self.committed = self.live.checkpoint()
        return self.committed


def ch_count(servers: list[ClickHouseService], database: str, condition: str) -> int:
    total = 0
    for server in servers:
        client = server.client(database=database)
        try:
            total += int(
                client.query(f"SELECT count() FROM events WHERE {condition}").result_rows[0][0]
            )
        finally:
            client.close()
    return total


@pytest.fixture
def two_server_cluster(
    *,
    tmp_path: Path,
    zookeeper: ZooKeeperEnsemble,
    kafka: KafkaBroker,
    clickhouse: ClickHouseService,
    clickhouse2: ClickHouseService,
    ch_database2: str,
    spark_connect: SparkConnectServer,
    zk_root: str,
    topic_prefix: str,
) -> Iterator[LocalCluster]:
    """Nodes n1 and n2 leading shards 0 and 1, one on each ClickHouse server; they flush
    through the session's Spark Connect server, as make_cluster's do."""
    first, second = (f"127.0.0.1:{ch.port}" for ch in (clickhouse, clickhouse2))
    stack = StackEndpoints(zookeeper.hosts, kafka.bootstrap, first, (first, second))
    topic = f"{topic_prefix}_events"
    create_topic(kafka.bootstrap, topic, PARTITIONS)
    cluster = LocalCluster(
        tmp_path / "cluster",
        stack,
        nodes={"n1": [0], "n2": [1]},
        shard_count=2,
        pipelines=[PipelineSpec("events", topic, "events", EVENT_COLUMNS, buffer=FLOWING)],
        zk_root=zk_root,
        database=ch_database2,
        session_timeout=3.0,
        rows_per_task=100_000,
        spark={"remote": spark_connect.url},
    )
    try:
        cluster.start()
        cluster.wait_leaders([0, 1])
        yield cluster
    finally:
        cluster.kill()  # a clean stop checks nothing here


def test_include_buffer_while_data_flows_returns_each_offset_once(
    *,
    spark: SparkSession,
    two_server_cluster: LocalCluster,
    kafka: KafkaBroker,
    clickhouse: ClickHouseService,
    clickhouse2: ClickHouseService,
    ch_database2: str,
    topic_prefix: str,
) -> None:
    config = load_config(two_server_cluster.nodes["n1"].config_path)
    servers = [clickhouse, clickhouse2]
    done = threading.Event()

    def flow() -> None:
        start = 0
        while not done.is_set() and start < 200_000:
            produce(
                kafka.bootstrap, f"{topic_prefix}_events", 1000, partitions=PARTITIONS, start=start
            )
            start += 1000
            done.wait(0.2)

    answered: dict[int, int] = {0: 0, 1: 0}  # pushed batches answered, per shard

    def push_flow(shard: int) -> None:
        # A writer per shard pushes PUSH_ROWS-row batches beside the topic's rows.
        node = two_server_cluster.nodes[f"n{shard + 1}"]
        pusher = Pusher(lambda: [node.url], "events", shard, f"fresh-s{shard}", wait_s=60)
        while not done.is_set() and answered[shard] < 200:
            ids = range(answered[shard] * PUSH_ROWS, (answered[shard] + 1) * PUSH_ROWS)
            rows = pa.table({"id": list(ids), "kind": ["push"] * PUSH_ROWS,
                             "amount": [0.5] * PUSH_ROWS})  # fmt: skip
            pusher.push(answered[shard], rows)
            answered[shard] += 1

    producer = threading.Thread(target=flow, daemon=True)
    producer.start()
    pushers = [threading.Thread(target=push_flow, args=(s,), daemon=True) for s in (0, 1)]
    for thread in pushers:
        thread.start()
    try:
        # Both shards have flushed into their own server, and data keeps coming.
        wait_until(
            lambda: (
                all(ch_count([s], ch_database2, "1") > 0 for s in servers)
                and min(answered.values()) > 0
            ),
            timeout=120,
            what="a flush into each shard's ClickHouse, pushed batches among them",
        )
        view = cluster_view(config, "events", include_buffer=True)
        assert [[r.port for r in s.replicas] for s in view.shards] == [
            [clickhouse.port],
            [clickhouse2.port],
        ]
        assert isinstance(view.buffer, LeaderBuffers)
        recorded = Recorded(view.buffer)
        df = read_table(
            spark,
            "events",
            cluster=Cluster(view.shards, recorded),
            database=ch_database2,
            include_buffer=True,
        )
        got = [(r._partition, r._offset) for r in df.select("_partition", "_offset").collect()]
    finally:
        done.set()
        producer.join(timeout=30)
        for thread in pushers:
            thread.join(timeout=90)

    assert len(got) == len(set(got)), "no (partition, offset) twice"
    for partition in range(PARTITIONS):
        offsets = sorted(o for p, o in got if p == partition)
        assert offsets == list(range(len(offsets))), f"partition {partition}: no gap"
    # Each writer's batches once and whole, from its first on, wherever each one was.
    writers = sorted({p for p, _ in got if p < 0})
    assert len(writers) == 2, writers
    for partition in writers:
        offsets = sorted(o for p, o in got if p == partition)
        batches = sorted({o >> 20 for o in offsets})
        assert batches == list(range(len(batches))), f"writer partition {partition}"
        assert offsets == [(b << 20) + i for b in batches for i in range(PUSH_ROWS)]
    assert recorded.buffered is not None and recorded.committed
    flushed = ch_count(servers, ch_database2, committed_condition(recorded.committed))
    buffered = above_checkpoint(recorded.buffered, recorded.committed).num_rows
    assert flushed > 0 and buffered > 0, (flushed, buffered)
    assert len(got) == flushed + buffered


def test_cluster_view_leaves_out_a_node_under_replacement(
    two_server_cluster: LocalCluster,
) -> None:
    config = load_config(two_server_cluster.nodes["n1"].config_path)
    with connect(config) as coordinator:
        coordinator.mark_replacing("n2", "disk swap")
    view = cluster_view(config, "events")
    readable = {s.shard: [r.name for r in s.readable()] for s in view.shards}
    assert readable == {0: ["n1"], 1: []}
    with pytest.raises(ValueError, match=r"shard 1: no replica to read, all under replacement"):
        view.read_order(random.Random(0))
