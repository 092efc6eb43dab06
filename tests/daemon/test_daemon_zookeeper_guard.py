"""`hakafka run` refuses to join its cluster when another live daemon holds its node id, or
when its root is open to anyone under `require_acl`; `hakafka init` with auth closes the root.
Real ZooKeeper (and the ClickHouse front for init); the daemon never gets as far as Kafka."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError

from devstack.process import free_port
from hakafka.config import ENV_ZK_PASSWORD
from hakafka.coordination import Coordinator, NodeInfo, ZkConfig, paths
from tests.commands import hakafka

pytestmark = pytest.mark.integration

PASSWORD = "zk-s3cret"


def config(
    tmp_path: Path,
    hosts: str,
    root: str,
    *,
    zookeeper: str = "",
    ch: str = "",
    replica: str = "127.0.0.1:9",
) -> Path:
    """A one-node config: `zookeeper` and `ch` are extra lines of those sections."""
    path = tmp_path / "hakafka.toml"
    path.write_text(
        textwrap.dedent(f"""
        node = "n1"
        shards = [0]
        data_dir = "{tmp_path / "data"}"

        [zookeeper]
        hosts = "{hosts}"
        root = "{root}"
        session_timeout = 2
        request_timeout = 2
        {zookeeper}

        [kafka]
        bootstrap = "127.0.0.1:9"

        [clickhouse]
        {ch}
        [clickhouse.replicas.0]
        n1 = "{replica}"

        [server]
        http = "127.0.0.1:{free_port()}"
        flight = "127.0.0.1:{free_port()}"

        [[pipelines]]
        name = "events"
        topic = "events"
        table = "events"
        [pipelines.columns]
        id = "Int64"
        """)
    )
    return path


def holder(hosts: str, root: str, auth: tuple[str, str] | None = None) -> Coordinator:
    info = NodeInfo("127.0.0.1", "", "", os.getpid(), "test")
    coordinator = Coordinator(
        ZkConfig(hosts, root, session_timeout_s=2.0, request_timeout_s=2.0, auth=auth), "n1", info
    )
    coordinator.start()
    return coordinator


def test_run_refuses_a_node_id_held_by_a_live_daemon(
    zookeeper: Any, zk_root: str, tmp_path: Path
) -> None:
    other = holder(zookeeper.hosts, zk_root)
    try:
        other.register()
        run = hakafka(
            "run", "--config", str(config(tmp_path, zookeeper.hosts, zk_root)), timeout=60
        )
        assert run.code == 1, run.err[-2000:]
        assert (
            f"hakafka: node id n1 is held by another live session (registered by pid "
            f"{os.getpid()} on host 127.0.0.1 at " in run.err
        ), run.err[-2000:]
        stat = other.session.exists(paths.node("n1"))
        assert stat is not None and stat.ephemeralOwner == other.session.session_id
    finally:
        other.close()


def test_run_refuses_an_open_root_under_require_acl_until_init_closes_it(
    *,
    zookeeper: Any,
    zk_root: str,
    tmp_path: Path,
    clickhouse: Any,
    ch_database: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    opened = holder(zookeeper.hosts, zk_root)  # no auth: the root is created open
    opened.close()
    monkeypatch.setenv(ENV_ZK_PASSWORD, PASSWORD)  # the commands inherit it
    path = config(
        tmp_path,
        zookeeper.hosts,
        zk_root,
        zookeeper='auth_user = "hakafka"\nrequire_acl = true',
        ch=f'database = "{ch_database}"',
        replica=f"{clickhouse.host}:{clickhouse.port}",
    )
    run = hakafka("run", "--config", str(path), timeout=60)
    assert run.code == 1, run.err[-2000:]
    assert f"hakafka: zookeeper.require_acl: the ACL of {zk_root} lets anyone" in run.err
    assert "run `hakafka init`" in run.err

    init = hakafka("init", "--config", str(path))
    assert init.code == 0, init.err
    assert f"zookeeper: {zk_root} and every znode under it: user hakafka only (" in init.out
    anonymous = KazooClient(hosts=zookeeper.hosts, timeout=10.0)
    anonymous.start(timeout=10)
    try:
        with pytest.raises(NoAuthError):
            anonymous.create(f"{zk_root}{paths.node('n1')}", b"{}", ephemeral=True)
        with pytest.raises(NoAuthError):
            anonymous.get(f"{zk_root}{paths.epoch(0)}")
    finally:
        anonymous.stop()
        anonymous.close()
    secured = holder(zookeeper.hosts, zk_root, auth=("hakafka", PASSWORD))
    try:
        assert secured.session.open_to_anyone() == []
    finally:
        secured.close()
