"""No `hakafka` command but `run` loads Spark, chdb, the daemon or the pipeline.

Each command runs in a fresh interpreter (this one has loaded everything already), and the
modules it left in `sys.modules` are checked. The operator commands talk to ZooKeeper and
to the leaders' endpoints; they have no use for pyspark (seconds to import), chdb or the dev
tooling, and must keep working on a host where those are broken.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.fresh import fresh_python, loaded

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "systemd" / "hakafka.toml"
BANNED = ["pyspark", "chdb", "hakafka.daemon", "hakafka.pipeline", "devstack"]

# Calls the command's `main`, then prints the exit code and every loaded module as the
# last line of stdout.
_PROBE = """
import json, sys
from hakafka.cli import main
try:
    code = main({argv!r})
except SystemExit as exc:
    code = exc.code
print()
print(json.dumps({{"code": code, "modules": sorted(sys.modules)}}))
"""


# The example config reads its ZooKeeper password from a systemd credential, which a test
# machine does not have; the environment variable wins over the file.
EXAMPLE_ENV = {"HAKAFKA_ZK_PASSWORD": "example-password"}


def run_command(argv: list[str]) -> tuple[int, list[str]]:
    """(exit code, loaded modules) of `hakafka ARGV` in a fresh interpreter, with the example
    config's ZooKeeper password in the environment."""
    result = json.loads(fresh_python(_PROBE.format(argv=argv), env=EXAMPLE_ENV).splitlines()[-1])
    return result["code"], result["modules"]


def banned(modules: list[str]) -> list[str]:
    return loaded(BANNED, modules)


def config_for(tmp_path: Path) -> Path:
    """The example config with this test's data dir and a ZooKeeper that is not there (a
    closed port, a 1 s connect timeout): cluster commands get as far as connecting."""
    text = EXAMPLE.read_text()
    text, dirs = re.subn(r"^data_dir = .*$", f'data_dir = "{tmp_path}"', text, flags=re.M)
    text, hosts = re.subn(r"^hosts = .*$", 'hosts = "127.0.0.1:1"', text, count=1, flags=re.M)
    text, timeouts = re.subn(r"^connect_timeout = .*$", "connect_timeout = 1", text, flags=re.M)
    assert (dirs, hosts, timeouts) == (1, 1, 1), "the example config changed shape"
    path = tmp_path / "hakafka.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["config", "check", "--help"],
        ["status", "--help"],
        ["failover", "--help"],
        ["query", "--help"],
        ["node", "replace", "--help"],
        ["wal", "--help"],
        ["init", "--help"],
    ],
    ids=" ".join,
)
def test_help_loads_no_spark_chdb_daemon_pipeline_or_devstack(argv: list[str]) -> None:
    code, modules = run_command(argv)
    assert code == 0
    assert banned(modules) == [], f"hakafka {' '.join(argv)} loaded {banned(modules)}"


def test_config_check_loads_no_spark_chdb_daemon_pipeline_or_devstack() -> None:
    code, modules = run_command(["config", "check", str(EXAMPLE)])
    assert code == 0
    assert "hakafka.config" in modules
    assert banned(modules) == [], f"hakafka config check loaded {banned(modules)}"


def test_wal_verify_loads_no_spark_chdb_daemon_pipeline_or_devstack(tmp_path: Path) -> None:
    code, modules = run_command(["wal", "verify", "--config", str(config_for(tmp_path))])
    assert code == 0  # no WAL directory yet: reported, not an error
    assert "hakafka.ops.wal" in modules
    assert banned(modules) == [], f"hakafka wal verify loaded {banned(modules)}"


@pytest.mark.parametrize(
    ("argv", "module"),
    [
        (["status"], "hakafka.ops.status"),
        (["init"], "hakafka.ops.init"),
        (["failover", "--shard", "0"], "hakafka.ops.failover"),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else v,
)
def test_cluster_commands_load_no_spark_chdb_daemon_pipeline_or_devstack(
    argv: list[str], module: str, tmp_path: Path
) -> None:
    # They fail to reach ZooKeeper (exit 1), after importing everything they work with.
    code, modules = run_command([*argv, "--config", str(config_for(tmp_path))])
    assert code == 1
    assert module in modules
    assert banned(modules) == [], f"hakafka {' '.join(argv)} loaded {banned(modules)}"


def test_run_is_the_command_that_may_load_the_daemon() -> None:
    # `run` loads Spark and the daemon when it starts; its --help need not stay light.
    code, _ = run_command(["run", "--help"])
    assert code == 0
