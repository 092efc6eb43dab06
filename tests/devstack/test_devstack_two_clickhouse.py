"""`python -m devstack up --clickhouse-servers 2`: a second ClickHouse server, a shard of its
own, started, reported and stopped by PID with the rest."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from devstack.clickhouse import ClickHouseService
from devstack.process import pid_alive
from tests.commands import devstack_cli

pytestmark = pytest.mark.integration


def test_up_with_two_clickhouse_servers_runs_two_independent_ones(
    tmp_path: Path, reap: None
) -> None:
    root = tmp_path / "stack"
    up = devstack_cli("up", "--root", str(root), "--clickhouse-servers", "2")
    assert up.returncode == 0, up.stderr
    try:
        status = devstack_cli("status", "--root", str(root), "--json")
        assert status.returncode == 0, status.stdout + status.stderr
        services = {s["name"]: s for s in json.loads(status.stdout)}
        assert {"clickhouse", "clickhouse2"} <= set(services) and all(
            s["healthy"] for s in services.values()
        ), services
        first, second = services["clickhouse"], services["clickhouse2"]
        assert first["pid"] != second["pid"] and first["endpoint"] != second["endpoint"]
        env = (root / "stack.env").read_text()
        assert f"HAKAFKA_CLICKHOUSE2_URL={second['endpoint']}\n" in env
        assert f"HAKAFKA_CLICKHOUSE_URL={first['endpoint']}\n" in env
        # Independent data: a table on one is not on the other.
        clients = [
            ClickHouseService(
                root / name, port=int(services[name]["endpoint"].rsplit(":", 1)[1])
            ).client()
            for name in ("clickhouse", "clickhouse2")
        ]
        clients[0].command("CREATE TABLE only_here (v Int64) ENGINE = MergeTree ORDER BY v")
        assert clients[0].query("EXISTS TABLE only_here").result_rows == [(1,)]
        assert clients[1].query("EXISTS TABLE only_here").result_rows == [(0,)]
        for client in clients:
            client.close()
    finally:
        down = devstack_cli("down", "--root", str(root))
    assert down.returncode == 0, down.stderr
    assert "stopped clickhouse2" in down.stdout
    assert not pid_alive(second["pid"]) and not pid_alive(first["pid"])
