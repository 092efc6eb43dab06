"""The unit files pass `systemd-analyze verify` and agree with the daemon's shutdown bound."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hakafka.daemon import SHUTDOWN_BOUND_S

UNITS = Path(__file__).resolve().parents[2] / "systemd"


def systemd_analyze() -> str:
    found = shutil.which("systemd-analyze")
    if found is None:
        # A fresh image has no package lists yet: update first, both bounded.
        for step in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "systemd"]):
            subprocess.run(step, capture_output=True, timeout=600, check=False)
        found = shutil.which("systemd-analyze")
    if found is None:
        pytest.skip(
            "systemd-analyze is missing and `apt-get update && apt-get install systemd` "
            "did not provide it (not root, or no network)"
        )
    return found


@pytest.mark.parametrize(
    ("unit", "verify_as"),
    [("hakafka.service", "hakafka.service"), ("hakafka@.service", "hakafka@demo.service")],
)
def test_unit_verifies(unit: str, verify_as: str, tmp_path: Path) -> None:
    text = (UNITS / unit).read_text()
    # verify checks that ExecStart's binary exists; the unit names `hakafka` (looked up in
    # /usr/local/bin, /usr/bin, ...), which here lives in the venv: verify a copy whose
    # ExecStart points at the venv's installed script, the rest unchanged.
    script = Path(sys.executable).with_name("hakafka")
    assert script.exists()
    assert "ExecStart=hakafka run --config /etc/hakafka/" in text
    (tmp_path / unit).write_text(text.replace("ExecStart=hakafka ", f"ExecStart={script} "))
    done = subprocess.run(
        [systemd_analyze(), "verify", str(tmp_path / verify_as)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    for needed in ("Type=notify", "WatchdogSec=", "Restart=on-failure", "User=hakafka",
                   "NoNewPrivileges=yes", "ProtectSystem=strict", "ProtectHome=yes",
                   "PrivateTmp=yes", "ReadWritePaths=/var/lib/hakafka",
                   "Environment=ARROW_DEFAULT_MEMORY_POOL=jemalloc"):  # fmt: skip
        assert needed in text, needed
    stop = re.search(r"^TimeoutStopSec=(\d+)$", text, re.M)
    assert stop is not None and SHUTDOWN_BOUND_S < int(stop.group(1)) <= SHUTDOWN_BOUND_S + 15


def test_example_config_is_valid() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "hakafka.cli", "config", "check", str(UNITS / "hakafka.toml")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
