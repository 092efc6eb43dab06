"""The wheel ships the daemon and its libraries, never the dev tooling (devstack)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEV_ONLY = ("devstack/", "chaos", "clickhouse_http", "demo")


def test_wheel_holds_the_daemon_and_no_dev_tooling(tmp_path: Path) -> None:
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = tmp_path.glob("hakafka-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    modules = [n for n in names if n.endswith(".py")]
    for shipped in (
        "hakafka/cli.py",
        "hakafka/pipeline/leader.py",
        "wal/log.py",
        "buffer/table.py",
        "spark_bridge/flush.py",
    ):
        assert shipped in modules, f"{shipped} missing from {wheel.name}"
    dev = [n for n in modules if any(part in n for part in DEV_ONLY)]
    assert dev == [], f"{wheel.name} ships dev tooling: {dev}"
