"""Fixtures for the operator tests: the stack's endpoints, clusters of real daemons, and the
`hakafka` command run as a separate process (its exit code is what scripts see)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from hakafka.devstack.clickhouse import ClickHouseService
from hakafka.devstack.cluster import LocalCluster, PipelineSpec, StackEndpoints
from hakafka.devstack.kafka import KafkaBroker
from hakafka.devstack.records import EVENT_COLUMNS
from hakafka.devstack.zookeeper import ZooKeeperEnsemble


@dataclass(frozen=True)
class Run:
    code: int
    out: str
    err: str
    raw: bytes  # stdout as written (for --format arrow)


def _hakafka(*args: str, timeout: float = 120.0) -> Run:
    done = subprocess.run(
        [sys.executable, "-m", "hakafka.cli", *args],
        capture_output=True,
        timeout=timeout,
        check=False,
    )
    return Run(
        done.returncode,
        done.stdout.decode(errors="replace"),
        done.stderr.decode(errors="replace"),
        done.stdout,
    )


@pytest.fixture
def hakafka() -> Callable[..., Run]:
    """Runs `hakafka ARGS...` as a child process; returns its exit code and output."""
    return _hakafka


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
        nodes: dict[str, list[int]],
        buffer: dict[str, int | float] | None = None,
        on_error: str = "dead_letter",
    ) -> LocalCluster:
        pipeline = PipelineSpec(
            name="events",
            topic=f"{topic_prefix}_events",
            table="events",
            columns=EVENT_COLUMNS,
            buffer=buffer
            or {"min_rows": 5000, "max_rows": 100_000, "min_bytes": 1, "min_age": 1, "max_age": 3},
            on_error=on_error,
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
