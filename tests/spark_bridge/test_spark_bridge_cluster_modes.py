"""Flushes through a real Spark cluster: a standalone master + worker, and a Spark Connect
server, both started from PySpark's jars (`devstack.spark_cluster`); the Connect server is the
test session's (`spark_connect` in tests/conftest.py), which the cluster tests share.

Each mode is exercised twice: by `flush_block` from a fresh interpreter (Connect only: a
process with a classic session, such as the test session's `local[2]` one, cannot open a
Connect session, and a classic session for the standalone master would be that one), and
by `hakafka run` daemons configured with `[spark] master` or `remote`, whose leader is
SIGKILLed while a block is pending (written to ZooKeeper, not committed).
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from devstack.clickhouse import ClickHouseService
from devstack.cluster import LocalCluster, PipelineSpec, StackEndpoints
from devstack.records import EVENT_COLUMNS, create_topic
from devstack.spark_cluster import SparkConnectServer, SparkStandalone
from hakafka.coordination import paths
from hakafka.coordination.records import PendingIntent
from tests.fresh import fresh_python
from tests.helpers.landing import PARTITIONS, assert_exactly_once, landed, produce
from tests.helpers.logs import log_events
from tests.helpers.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.slow]


@dataclass
class SparkMode:
    """A running Spark cluster and the `[spark]` keys a daemon uses it with."""

    url: str
    keys: dict[str, str]


@pytest.fixture(scope="module", params=["standalone", "connect"])
def spark_mode(request: pytest.FixtureRequest, stack_root: Path) -> Iterator[SparkMode]:
    """The standalone cluster is started for this module's tests of it and stopped by PID
    after them (it is heavy on 2 cores); Spark Connect is the session's server."""
    if request.param == "connect":
        server: SparkConnectServer = request.getfixturevalue("spark_connect")
        yield SparkMode(server.url, {"remote": server.url})
        return
    standalone = SparkStandalone(stack_root / "spark-standalone")
    standalone.start()
    try:
        yield SparkMode(standalone.url, {"master": standalone.url})
    finally:
        standalone.stop()


CONNECT_PROBE = """
import json
from tests.spark_bridge.spark_connect_probe import flush_through_connect
print(json.dumps(flush_through_connect({url!r}, {database!r}, {host!r}, {port!r})))
"""


@pytest.mark.parametrize("spark_mode", ["connect"], indirect=True)
def test_flush_block_through_spark_connect_exactly_once(
    spark_mode: SparkMode, clickhouse: ClickHouseService, ch_database: str
) -> None:
    code = CONNECT_PROBE.format(
        url=spark_mode.url, database=ch_database, host=clickhouse.host, port=clickhouse.port
    )
    seen = json.loads(fresh_python(code, timeout=300).splitlines()[-1])
    assert seen == {
        "module": "pyspark.sql.connect.session",
        "first": [200_000, 4, 1, 200_000, 200_000],
        "again": [4, 200_000, 200_000],
        "doubled_rows": 1_000,
        "doubled_sum": 2 * sum(range(1_000)),
        "mode_left": False,
    }


def _pending_blocks(zk: KazooClient) -> set[str]:
    """The block of shard 0's `events` whose intent is in ZooKeeper (what the next leader
    re-flushes), if any. Not the node's log: a node killed between its commit and the log
    line that reports it would show the block there as still in flight."""
    path = paths.pending(0, "events")
    try:
        raw, _ = zk.get(path)
    except NoNodeError:
        return set()
    return {PendingIntent.decode(path, raw).block_id}


@pytest.fixture
def two_nodes(  # noqa: PLR0917 -- fixtures
    spark_mode: SparkMode,
    tmp_path: Path,
    stack: StackEndpoints,
    zk_root: str,
    ch_database: str,
    topic_prefix: str,
) -> Iterator[LocalCluster]:
    """Nodes n1 and n2 of one shard flushing through `spark_mode`'s cluster, topic
    `<prefix>_events` of 8 partitions; stopped after the test."""
    create_topic(stack.kafka, f"{topic_prefix}_events", PARTITIONS)
    pipeline = PipelineSpec(
        name="events",
        topic=f"{topic_prefix}_events",
        table="events",
        columns=EVENT_COLUMNS,
        buffer={"min_rows": 20_000, "max_rows": 40_000, "min_bytes": 1, "min_age": 1},
    )
    cluster = LocalCluster(
        tmp_path / "cluster",
        stack,
        nodes={"n1": [0], "n2": [0]},
        shard_count=1,
        pipelines=[pipeline],
        zk_root=zk_root,
        database=ch_database,
        session_timeout=3.0,
        # Many small tasks: a block's flush takes seconds on the cluster's one core.
        rows_per_task=2_000,
        spark=spark_mode.keys,
    )
    try:
        yield cluster
    finally:
        cluster.kill()  # a clean stop checks nothing here


def test_leader_killed_during_a_flush_through_the_cluster_exactly_once(  # noqa: PLR0917 -- fixtures
    spark_mode: SparkMode,
    two_nodes: LocalCluster,
    stack: StackEndpoints,
    topic_prefix: str,
    ch_client: Any,
    zk_root: str,
) -> None:
    cluster, topic = two_nodes, f"{topic_prefix}_events"
    n1, n2 = cluster.nodes["n1"], cluster.nodes["n2"]
    n1.start()
    n1.wait_up()
    cluster.wait_leaders([0])
    produced = produce(stack.kafka, topic, 120_000)
    # The first block is committed: Spark is up. Then kill n1 once a later block is in
    # flight: its intent is in ZooKeeper and the commit has not come.
    wait_for(lambda: landed(ch_client, "events") > 0, 240, "n1's first flush")
    zk = KazooClient(hosts=f"{stack.zookeeper}{zk_root}", timeout=10.0)
    zk.start(10)
    try:
        wait_for(lambda: bool(_pending_blocks(zk)), 120, "a block in flight", interval=0.02)
        n1.kill(signal.SIGKILL)
        assert n1.wait_exit(30) == -signal.SIGKILL
        killed = _pending_blocks(zk)
    finally:
        zk.stop()
        zk.close()
    assert killed, "n1 died with a block in flight"
    started = [e for e in log_events(n1.log_path) if e["event"] == "spark.started"]
    assert [e["master"] for e in started] == [spark_mode.url]
    n2.start()
    n2.wait_up()
    cluster.wait_leaders([0])
    wait_for(lambda: landed(ch_client, "events") >= len(produced.good), 300, "every row")
    time.sleep(4)  # one more flush cycle: nothing may arrive twice afterwards
    assert_exactly_once(ch_client, "events", produced.good)
    reflushed = {e["block"] for e in log_events(n2.log_path) if e["event"] == "pending.reflush"}
    assert killed <= reflushed, (killed, reflushed)
    started = [e for e in log_events(n2.log_path) if e["event"] == "spark.started"]
    assert [e["master"] for e in started] == [spark_mode.url]
