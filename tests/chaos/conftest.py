"""Chaos fixtures: a stack of its own (the faults stop and kill it), started and stopped by PID.

A 3-member ZooKeeper ensemble, moto S3 with the tansu broker on `s3://` (a broker restart
keeps every record), and a ClickHouse front. They are module-scoped and not shared with the
other tests, whose session services the chaos must not disturb.

`--chaos-long` (used by `make chaos`) selects the long schedule (>= 50 faults); without it the
short one runs, as part of `make test`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from devstack.clickhouse import ClickHouseService
from devstack.kafka import KafkaBroker
from devstack.moto import MotoS3
from devstack.process import running
from devstack.zookeeper import ZooKeeperEnsemble

LONG_OPTION = "--chaos-long"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        LONG_OPTION,
        action="store_true",
        default=False,
        help="run the long chaos schedule (at least 50 faults) instead of the short one",
    )


@pytest.fixture
def chaos_long(request: pytest.FixtureRequest) -> bool:
    # The option exists only when this conftest was loaded at startup (pytest tests/chaos).
    return bool(request.config.getoption("chaos_long", default=False))


@pytest.fixture(scope="module")
def chaos_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("chaos")


@pytest.fixture(scope="module")
def chaos_zookeeper(chaos_root: Path) -> Iterator[ZooKeeperEnsemble]:
    with running(ZooKeeperEnsemble(chaos_root / "zookeeper", members=3)) as zk:
        yield zk


@pytest.fixture(scope="module")
def chaos_broker(chaos_root: Path) -> Iterator[KafkaBroker]:
    """The tansu broker on durable `s3://` storage in a moto server of its own."""
    with (
        running(MotoS3(chaos_root / "moto")) as s3,
        running(KafkaBroker(chaos_root / "kafka", s3=s3)) as broker,
    ):
        yield broker


@pytest.fixture(scope="module")
def chaos_clickhouse(chaos_root: Path) -> Iterator[ClickHouseService]:
    with running(ClickHouseService(chaos_root / "clickhouse")) as ch:
        yield ch
