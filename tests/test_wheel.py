"""The wheel ships the daemon and its libraries, never the dev tooling (devstack)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEV_ONLY = ("devstack/", "chaos", "clickhouse_http", "demo")


def test_wheel_holds_the_daemon_and_no_dev_tooling(tmp_path: Path) -> None:
    # Build from the files git knows, as a fresh clone would: a build/ directory left in the
    # checkout by an earlier build can hold stale modules that setuptools would ship.
    source = tmp_path / "source"
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
        timeout=60,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(source)],
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
        "chlib/tables.py",
        "spark_bridge/flush.py",
        "retry_policy/__init__.py",
    ):
        assert shipped in modules, f"{shipped} missing from {wheel.name}"
    assert "hakafka/daemon/page.html" in names, f"the status page is missing from {wheel.name}"
    dev = [n for n in modules if any(part in n for part in DEV_ONLY)]
    assert dev == [], f"{wheel.name} ships dev tooling: {dev}"
