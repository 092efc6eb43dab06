"""Shared fixtures: the real local stack, started once per test session by devstack.

Services are session-scoped (ZooKeeper, the tansu broker, the ClickHouse HTTP front, Spark;
a second ClickHouse front, `clickhouse2`, only for the tests that ask for it);
every test gets its own namespace in each (a ZooKeeper chroot-like root, topic names, a
ClickHouse database), so tests do not see each other's data. Everything is stopped by PID
when the session ends.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from devstack.cluster import LocalCluster, PipelineSpec, StackEndpoints
from devstack.process import running
from devstack.records import EVENT_COLUMNS

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client
    from pyspark.sql import SparkSession

    from devstack.clickhouse import ClickHouseService
    from devstack.kafka import KafkaBroker
    from devstack.spark_cluster import SparkConnectServer
    from devstack.zookeeper import ZooKeeperEnsemble


_CLUSTERS = pytest.StashKey[list[LocalCluster]]()
_LOG_LINES = 40


def _worth_reading(line: str) -> bool:
    """A log line that may say why a test failed: not a routine info/debug event."""
    return '"level": "info"' not in line and '"level": "debug"' not in line


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failed test that ran a cluster shows each node's last warnings and errors (and the
    JVM's lines) in its report: in CI that output is all there is to read afterwards."""
    report = yield
    if report.failed:
        for cluster in item.stash.get(_CLUSTERS, []):
            for name, node in cluster.nodes.items():
                try:
                    logged = node.log_path.read_text(errors="replace").splitlines()
                except FileNotFoundError:
                    logged = []
                lines = [ln for ln in logged if _worth_reading(ln)]
                text = "\n".join(lines[-_LOG_LINES:]) or "(no warnings or errors)"
                report.sections.append((f"node {name}: last warnings and errors", text))
    return report


# What a test is expected to take, to order files longest first (see below): `slow` says
# ~30 s unless it names its `seconds`; other integration tests start services and wait.
_SLOW_SECONDS = 30.0
_INTEGRATION_SECONDS = 5.0
_UNIT_SECONDS = 0.05


def _expected_seconds(item: pytest.Item) -> float:
    slow = item.get_closest_marker("slow")
    if slow is not None:
        return float(slow.kwargs.get("seconds", _SLOW_SECONDS))
    if item.get_closest_marker("integration") is not None:
        return _INTEGRATION_SECONDS
    return _UNIT_SECONDS


# The session fixtures that start a service: a test that uses one (directly or through
# another fixture) is an integration test, and must say so for `-m "not integration"`.
_SERVICES = frozenset(
    {
        "zookeeper",
        "zookeeper_ensemble",
        "kafka",
        "clickhouse",
        "clickhouse2",
        "spark",
        "spark_connect",
    }
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that starts a service without the `integration` mark is a usage error naming
    it. Files in order of their expected time, longest first, each file's tests in their own
    order. `make test` runs `--dist loadfile --no-loadscope-reorder`, so xdist hands files
    to its workers in this order: the 3-minute chaos run starts at once and short files
    fill in at the end, instead of the slowest ones starting last (xdist's own order is by
    test count, which put the single-test fault runs at the end: minutes of one worker
    alone)."""
    unmarked = [
        item.nodeid
        for item in items
        if _SERVICES & set(getattr(item, "fixturenames", ()))
        and item.get_closest_marker("integration") is None
    ]
    if unmarked:
        raise pytest.UsageError(
            "these tests start services (" + ", ".join(sorted(_SERVICES)) + ") but are not "
            "marked integration: " + ", ".join(unmarked)
        )
    cost: dict[Path, float] = {}
    for item in items:
        cost[item.path] = cost.get(item.path, 0.0) + _expected_seconds(item)
    first_seen = {path: i for i, path in enumerate(cost)}
    items.sort(key=lambda item: (-cost[item.path], first_seen[item.path]))


def _slug(request: pytest.FixtureRequest) -> str:
    """A short name unique to this test, usable in ZooKeeper paths, topics and databases."""
    base = re.sub(r"[^a-z0-9]+", "_", request.node.name.lower()).strip("_")[:40]
    return f"{base}_{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="session")
def stack_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("devstack")


@pytest.fixture(scope="session")
def zookeeper(stack_root: Path) -> Iterator[ZooKeeperEnsemble]:
    """A standalone ZooKeeper server (one member)."""
    from devstack.zookeeper import ZooKeeperEnsemble

    with running(ZooKeeperEnsemble(stack_root / "zk1", members=1)) as zk:
        yield zk


@pytest.fixture(scope="session")
def zookeeper_ensemble(stack_root: Path) -> Iterator[ZooKeeperEnsemble]:
    """A 3-member ZooKeeper ensemble, for quorum and member-failure tests."""
    from devstack.zookeeper import ZooKeeperEnsemble

    with running(ZooKeeperEnsemble(stack_root / "zk3", members=3)) as zk:
        yield zk


@pytest.fixture
def zk_root(request: pytest.FixtureRequest) -> str:
    """A ZooKeeper path unique to this test, e.g. `/t/test_x_1a2b3c4d`."""
    return f"/t/{_slug(request)}"


@pytest.fixture(scope="session")
def kafka(stack_root: Path) -> Iterator[KafkaBroker]:
    """The tansu broker on memory:// storage."""
    from devstack.kafka import KafkaBroker

    with running(KafkaBroker(stack_root / "kafka")) as broker:
        yield broker


@pytest.fixture
def topic_prefix(request: pytest.FixtureRequest) -> str:
    """A topic-name prefix unique to this test."""
    return _slug(request)


@pytest.fixture(scope="session")
def clickhouse(stack_root: Path) -> Iterator[ClickHouseService]:
    """chdb behind the ClickHouse HTTP interface, as a separate process."""
    from devstack.clickhouse import ClickHouseService

    with running(ClickHouseService(stack_root / "clickhouse")) as ch:
        yield ch


@pytest.fixture(scope="session")
def clickhouse2(stack_root: Path) -> Iterator[ClickHouseService]:
    """A second ClickHouse front, its own process and chdb data path: a second shard. Started
    only once a test asks for it, so the rest of the suite never pays for it."""
    from devstack.clickhouse import ClickHouseService

    with running(ClickHouseService(stack_root / "clickhouse2")) as ch:
        yield ch


@pytest.fixture
def ch_database2(ch_database: str, clickhouse2: ClickHouseService) -> Iterator[str]:
    """This test's database (`ch_database`) created on `clickhouse2` as well, dropped after."""
    admin = clickhouse2.client()
    admin.command(f"CREATE DATABASE `{ch_database}`")
    try:
        yield ch_database
    finally:
        admin.command(f"DROP DATABASE IF EXISTS `{ch_database}`")
        admin.close()


@pytest.fixture
def ch_database(request: pytest.FixtureRequest, clickhouse: ClickHouseService) -> Iterator[str]:
    """A ClickHouse database unique to this test, dropped afterwards."""
    name = _slug(request)
    admin = clickhouse.client()
    admin.command(f"CREATE DATABASE `{name}`")
    try:
        yield name
    finally:
        admin.command(f"DROP DATABASE IF EXISTS `{name}`")
        admin.close()


@pytest.fixture
def ch_client(clickhouse: ClickHouseService, ch_database: str) -> Iterator[Client]:
    """A clickhouse-connect HTTP client bound to this test's database."""
    client = clickhouse.client(database=ch_database)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    """One local[2] SparkSession for the whole test session, from the daemon's SparkRuntime."""
    from spark_bridge.runtime import SparkRuntime, SparkSettings

    warehouse = tmp_path_factory.mktemp("spark-warehouse")
    runtime = SparkRuntime(
        SparkSettings(
            app_name="hakafka-tests",
            conf={"spark.sql.shuffle.partitions": "4", "spark.sql.warehouse.dir": str(warehouse)},
        )
    )
    try:
        yield runtime.start()
    finally:
        runtime.stop()


@pytest.fixture(scope="session")
def spark_connect(stack_root: Path) -> Iterator[SparkConnectServer]:
    """One Spark Connect server (its own `local[2]`) for the test session, as a fleet shares
    Spark: the daemons `make_cluster` builds flush through it. A driver of their own costs
    each daemon's start ~8 s of JVM start and worker warm-up on 2 cores, and the suite starts
    85 daemons. The in-daemon driver, the default users run, keeps its own tests: the
    demo, the chaos run, `spark_bridge`'s, and any `make_cluster(spark={"master": ...})`."""
    from devstack.spark_cluster import SparkConnectServer

    with running(SparkConnectServer(stack_root / "spark-connect")) as server:
        yield server


@pytest.fixture
def stack(
    zookeeper: ZooKeeperEnsemble, kafka: KafkaBroker, clickhouse: ClickHouseService
) -> StackEndpoints:
    """Endpoints of the session's services, as a cluster's configs need them."""
    return StackEndpoints(zookeeper.hosts, kafka.bootstrap, f"127.0.0.1:{clickhouse.port}")


@pytest.fixture
def make_cluster(
    request: pytest.FixtureRequest,
    *,
    tmp_path: Path,
    stack: StackEndpoints,
    zk_root: str,
    ch_database: str,
    topic_prefix: str,
) -> Iterator[Callable[..., LocalCluster]]:
    """Build a cluster for this test (topic `<prefix>_events`, table `events`); stopped after.
    If the test fails, its report shows each node's last warnings and errors."""
    made: list[LocalCluster] = []
    request.node.stash[_CLUSTERS] = made

    def connect_url() -> str:
        server: SparkConnectServer = request.getfixturevalue("spark_connect")
        return server.url

    def make(
        nodes: dict[str, list[int]],
        buffer: dict[str, int | float] | None = None,
        on_error: str = "dead_letter",
        server: dict[str, object] | None = None,
        transform: str = "",
        *,
        spark_on_followers: bool = False,
        replica_per_node: bool = False,
        shard_count: int = 2,
        balance: dict[str, object] | None = None,
        # `[spark]` keys; None: flush through the session's Spark Connect server.
        spark: dict[str, object] | None = None,
        # One lane unless a test asks: a lane process per partition group and term costs
        # about 1.7 s of CPU, which the suite's many clusters on 2 cores felt (+3 minutes).
        lanes: int | str = 1,
    ) -> LocalCluster:
        pipeline = PipelineSpec(
            name="events",
            topic=f"{topic_prefix}_events",
            table="events",
            columns=EVENT_COLUMNS,
            buffer=buffer
            or {"min_rows": 5000, "max_rows": 100_000, "min_bytes": 1, "min_age": 1, "max_age": 3},
            on_error=on_error,
            transform=transform,
            lanes=lanes,
        )
        cluster = LocalCluster(
            tmp_path / f"cluster{len(made)}",
            stack,
            nodes=nodes,
            shard_count=shard_count,
            pipelines=[pipeline],
            zk_root=zk_root,
            database=ch_database,
            session_timeout=3.0,
            rows_per_task=100_000,
            server=server,
            spark_on_followers=spark_on_followers,
            replica_per_node=replica_per_node,
            balance=balance,
            spark=spark if spark is not None else {"remote": connect_url()},
        )
        made.append(cluster)
        return cluster

    try:
        yield make
    finally:
        for cluster in made:
            cluster.kill()
