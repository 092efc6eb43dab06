"""ZooKeeper over TLS only: an ensemble with no plain client port, mutual TLS, and two
`hakafka run` nodes (and the operator commands) that reach it through `[zookeeper] tls`."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devstack.cluster import LocalCluster, PipelineSpec, StackEndpoints
from devstack.process import wait_until
from devstack.records import EVENT_COLUMNS, create_topic, produce
from devstack.tls import CertificateFiles, make_certificates
from devstack.zookeeper import ZooKeeperEnsemble
from tests.commands import edit, hakafka
from tests.helpers.landing import assert_exactly_once, landed

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.slow]

PARTITIONS = 4


@pytest.fixture
def certificates(tmp_path: Path) -> CertificateFiles:
    return make_certificates(tmp_path / "certs")


@pytest.fixture
def tls_ensemble(tmp_path: Path, certificates: CertificateFiles) -> Iterator[ZooKeeperEnsemble]:
    """A standalone ZooKeeper serving clients over TLS only, requiring client certificates."""
    ensemble = ZooKeeperEnsemble(tmp_path / "zookeeper-tls", tls=certificates)
    ensemble.start(timeout=60)
    try:
        yield ensemble
    finally:
        ensemble.stop()


def test_two_nodes_over_zookeeper_tls_only_through_a_leader_kill(  # noqa: PLR0917 -- fixtures
    tmp_path: Path,
    stack: StackEndpoints,
    zk_root: str,
    ch_database: str,
    topic_prefix: str,
    ch_client: Any,
    tls_ensemble: ZooKeeperEnsemble,
) -> None:
    topic = f"{topic_prefix}_events"
    create_topic(stack.kafka, topic, PARTITIONS)
    cluster = LocalCluster(
        tmp_path / "cluster",
        stack,
        nodes={"n1": [0], "n2": [0]},
        shard_count=1,
        pipelines=[
            PipelineSpec(
                name="events",
                topic=topic,
                table="events",
                columns=EVENT_COLUMNS,
                buffer={"min_rows": 2000, "min_bytes": 1, "min_age": 0.5, "max_age": 2},
            )
        ],
        zk_root=zk_root,
        database=ch_database,
        session_timeout=3.0,
        zookeeper=tls_ensemble.client_keys(),
        zookeeper_hosts=dict.fromkeys(("n1", "n2"), tls_ensemble.hosts),
    )
    try:
        config = cluster.nodes["n1"].config_path
        init = hakafka("init", "--config", str(config))
        assert init.code == 0, init.err

        # A client without TLS finds no plain port to talk to: one line, exit 1.
        plain = config.with_name("plain.toml")
        plain.write_text(config.read_text())
        edit(plain, r"^tls = true$", "tls = false")
        edit(plain, r'^(ca_file|cert_file|key_file) = ".*"$', "", count=3)
        edit(plain, r"^session_timeout = .*$", "session_timeout = 3.0\nconnect_timeout = 1.5")
        refused = hakafka("status", "--config", str(plain))
        assert refused.code == 1 and len(refused.err.strip().splitlines()) == 1, refused.err
        assert tls_ensemble.hosts in refused.err

        cluster.start()
        victim = cluster.wait_leaders([0])[0]
        first = produce(stack.kafka, topic, 20_000, partitions=PARTITIONS)
        # Killed with rows consumed (in its WAL and buffer), before its Spark is up: the
        # survivor, elected over TLS, takes them from the checkpoint; one Spark start in all.
        node = cluster.nodes[victim]
        wait_until(
            lambda: sum(p["buffer_rows"] for p in node.pipelines()) > 0,
            timeout=60,
            what="rows consumed by the first leader",
        )
        node.kill(signal.SIGKILL)
        second = produce(stack.kafka, topic, 20_000, partitions=PARTITIONS, start=20_000)
        survivor = "n2" if victim == "n1" else "n1"
        assert cluster.wait_leaders([0], timeout=60) == {0: survivor}
        good = first.good | second.good
        wait_until(lambda: landed(ch_client, "events") >= len(good), timeout=180, what="every row")
        assert_exactly_once(ch_client, "events", good)

        status = hakafka("status", "--config", str(config), "--json")
        assert status.code == 0, status.err
    finally:
        cluster.kill()  # a clean stop checks nothing here
