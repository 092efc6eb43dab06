"""`python -m devstack up --spark standalone --spark connect`: Spark next to the stack, recorded
with it, healthy in `status`, stopped by PID in `down`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from devstack.process import pid_alive, processes_under
from tests.commands import devstack_cli

pytestmark = [pytest.mark.integration, pytest.mark.slow]


SPARK = {
    "spark_master": "spark://127.0.0.1:",
    "spark_worker": "http://127.0.0.1:",  # the master's UI, which counts the worker alive
    "spark_connect": "sc://127.0.0.1:",
}


def test_up_with_spark_records_checks_and_stops_it_by_pid(tmp_path: Path, reap: None) -> None:
    root = tmp_path / "stack"
    up = devstack_cli(
        "up", "--root", str(root), "--spark", "standalone", "--spark", "connect", timeout=300
    )
    assert up.returncode == 0, up.stdout + up.stderr
    try:
        status = devstack_cli("status", "--root", str(root), "--json")
        assert status.returncode == 0, status.stdout + status.stderr
        services = {s["name"]: s for s in json.loads(status.stdout)}
        assert set(SPARK) <= services.keys(), services
        for name, prefix in SPARK.items():
            assert services[name]["healthy"], services[name]
            assert services[name]["endpoint"].startswith(prefix)
        env = (root / "stack.env").read_text()
        assert f"HAKAFKA_SPARK_MASTER={services['spark_master']['endpoint']}\n" in env
        assert f"HAKAFKA_SPARK_REMOTE={services['spark_connect']['endpoint']}\n" in env
        # Asked again, nothing new starts: the same PIDs are recorded.
        again = devstack_cli("up", "--root", str(root), "--spark", "connect", timeout=120)
        assert again.returncode == 0, again.stdout + again.stderr
        status = devstack_cli("status", "--root", str(root), "--json")
        assert {s["name"]: s["pid"] for s in json.loads(status.stdout)} == {
            name: s["pid"] for name, s in services.items()
        }
    finally:
        down = devstack_cli("down", "--root", str(root), timeout=120)
    assert down.returncode == 0, down.stderr
    for name in SPARK:
        assert f"stopped {name} (pid {services[name]['pid']})" in down.stdout
        assert not pid_alive(services[name]["pid"])
    assert processes_under(root) == {}
