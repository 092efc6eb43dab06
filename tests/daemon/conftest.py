"""Fixtures for daemon tests: the stack's endpoints and clusters of real daemons."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hakafka.devstack.clickhouse import ClickHouseService
from hakafka.devstack.cluster import LocalCluster, PipelineSpec, StackEndpoints
from hakafka.devstack.kafka import KafkaBroker
from hakafka.devstack.records import EVENT_COLUMNS
from hakafka.devstack.zookeeper import ZooKeeperEnsemble


@pytest.fixture
def stack(
    zookeeper: ZooKeeperEnsemble, kafka: KafkaBroker, clickhouse: ClickHouseService
) -> StackEndpoints:
    return StackEndpoints(zookeeper.hosts, kafka.bootstrap, f"127.0.0.1:{clickhouse.port}")


@pytest.fixture
def make_cluster(
    tmp_path: Path, stack: StackEndpoints, zk_root: str, ch_database: str, topic_prefix: str
) -> Iterator[Callable[..., LocalCluster]]:
    """Build a cluster for this test (topic `<prefix>_events`, table `events`); stopped after."""
    made: list[LocalCluster] = []

    def make(
        nodes: dict[str, list[int]], buffer: dict[str, int | float] | None = None
    ) -> LocalCluster:
        pipeline = PipelineSpec(
            name="events",
            topic=f"{topic_prefix}_events",
            table="events",
            columns=EVENT_COLUMNS,
            buffer=buffer
            or {"min_rows": 5000, "max_rows": 100_000, "min_bytes": 1, "min_age": 1, "max_age": 3},
        )
        cluster = LocalCluster(
            tmp_path / f"cluster{len(made)}",
            stack,
            nodes=nodes,
            shard_count=2,
            pipelines=[pipeline],
            zk_root=zk_root,
            database=ch_database,
            session_timeout=3.0,
            rows_per_task=100_000,
        )
        made.append(cluster)
        return cluster

    try:
        yield make
    finally:
        for cluster in made:
            cluster.stop()
