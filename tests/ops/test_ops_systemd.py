"""The unit files pass `systemd-analyze verify`, agree with the daemon's shutdown bound and
rate OK (below 3.0) in `systemd-analyze security --offline=yes`."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from hakafka.config import ENV_ZK_PASSWORD
from hakafka.daemon import SHUTDOWN_BOUND_S

UNITS = Path(__file__).resolve().parents[2] / "systemd"


def systemd_analyze() -> str:
    found = shutil.which("systemd-analyze")
    # `make install` installs it (package systemd) like Java: a missing tool fails, never skips.
    assert found is not None, "systemd-analyze not found: run `make install` (apt systemd)"
    return found


SECURITY_OK = 3.0  # systemd-analyze's "OK" band ends below 3.0 (then MEDIUM)


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


@pytest.mark.parametrize("unit", ["hakafka.service", "hakafka@.service"])
def test_unit_security_exposure_is_ok(unit: str) -> None:
    done = subprocess.run(
        [systemd_analyze(), "security", "--offline=yes", "--no-pager", str(UNITS / unit)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    print(done.stdout, done.stderr)  # the whole table, in the test log (-rA)
    found = re.search(r"Overall exposure level for \S+: (\d+\.\d+) (\w+)", done.stdout)
    assert found is not None, done.stdout + done.stderr
    score, label = float(found.group(1)), found.group(2)
    assert score < SECURITY_OK and label == "OK", f"{unit}: exposure {score} {label}"
    # The JVM's JIT needs writable+executable memory: this must stay off.
    assert not re.search(r"^MemoryDenyWriteExecute=", (UNITS / unit).read_text(), re.M)


def test_example_config_is_valid() -> None:
    # Its ZooKeeper password is a systemd credential, present only under the unit: the
    # variable, which wins over the file, stands in for it.
    done = subprocess.run(
        [sys.executable, "-m", "hakafka.cli", "config", "check", str(UNITS / "hakafka.toml")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, ENV_ZK_PASSWORD: "example"},
    )
    assert done.returncode == 0, done.stderr


def test_example_config_authenticates_to_zookeeper_with_a_credential() -> None:
    text = (UNITS / "hakafka.toml").read_text()
    zookeeper = tomllib.loads(text)["zookeeper"]
    assert zookeeper["auth_user"] and zookeeper["require_acl"] is True
    credential = Path(zookeeper["auth_password_file"])
    assert credential.parent == Path("/run/credentials/hakafka.service")
    unit = (UNITS / "hakafka.service").read_text()
    assert f"\nLoadCredential={credential.name}:/etc/hakafka/" in unit
