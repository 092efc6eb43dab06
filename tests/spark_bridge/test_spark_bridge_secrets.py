"""Spark secrets stay out of sight: `[spark.conf]` never reaches the driver JVM's command line
(read from /proc as any local user could), a Spark Connect token never reaches a log line,
an error or a repr."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import structlog

from spark_bridge.redact import redact
from spark_bridge.runtime import SparkRuntime, SparkSettings, SparkStartError, write_properties

PROBE = Path(__file__).with_name("spark_secret_probe.py")
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("sc://spark:15002/;token=abc123;user_id=me", "sc://spark:15002/;token=***;user_id=me"),
        # How PySpark quotes a bad Spark Connect URL in its error (scheme rewritten).
        (
            "Hostname is missing in the URL: 'http://:15002/;use_ssl=true;token=abc123'.",
            "Hostname is missing in the URL: 'http://:15002/;use_ssl=true;token=***'.",
        ),
        (
            "https://ops:pa55@h:8443/x?password=p4ss&db=a&api_key=k3y",
            "https://ops:***@h:8443/x?password=***&db=a&api_key=***",
        ),
        (
            "--conf spark.ssl.keyPassword=s3 --conf x=1",
            "--conf spark.ssl.keyPassword=*** --conf x=1",
        ),
        ("local[2]", "local[2]"),
        ("sc://spark:15002", "sc://spark:15002"),
    ],
)
def test_redact_masks_secret_parameters_and_url_passwords(text: str, shown: str) -> None:
    assert redact(text) == shown


def test_settings_repr_and_where_hide_the_token_and_conf() -> None:
    settings = SparkSettings(
        remote="sc://spark:15002/;token=abc123", conf={"spark.hadoop.fs.s3a.secret.key": "k3y"}
    )
    assert "abc123" not in repr(settings) and "k3y" not in repr(settings)
    assert settings.where == "sc://spark:15002/;token=***"
    assert SparkSettings(master="local[4]").where == "local[4]"


def test_spark_config_repr_hides_remote_and_conf() -> None:
    from hakafka.config import SparkConfig

    config = SparkConfig(remote="sc://spark:15002/;token=abc123", conf={"spark.x.secret": "k3y"})
    assert "abc123" not in repr(config) and "k3y" not in repr(config)


def test_a_spark_connect_start_error_is_redacted() -> None:
    runtime = SparkRuntime(SparkSettings(remote="sc://:15002/;token=abc123"))
    with structlog.testing.capture_logs() as logs, pytest.raises(SparkStartError) as failed:
        runtime.start()
    text = str(failed.value)
    assert text.startswith("cannot start a Spark Connect session at sc://:15002/;token=***: ")
    assert "abc123" not in text and failed.value.__cause__ is None
    assert "abc123" not in repr(logs)


def test_properties_file_is_private_and_escaped(tmp_path: Path) -> None:
    path = write_properties(tmp_path / "p", {"a b": "x=y:z #!\\\n\tend"})
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_text() == "a\\ b=x\\=y\\:z\\ \\#\\!\\\\\\n\\tend\n"
    with pytest.raises(FileExistsError):  # never written into a file someone else made
        write_properties(path, {})


@pytest.mark.integration
@pytest.mark.spark
def test_spark_conf_never_reaches_the_jvm_command_line(tmp_path: Path) -> None:
    key, secret = "spark.hakafka.probe.password", "s3cr3t-#!=:\\ é value"
    done = subprocess.run(
        [sys.executable, str(PROBE), key, secret],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
        cwd=ROOT,
        env={**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    jvm = [argv for argv in report["cmdlines"] if "org.apache.spark.deploy.SparkSubmit" in argv]
    assert len(jvm) == 1, report["cmdlines"]
    # The JVM got its settings from the file: the driver memory became its heap size...
    assert "-Xmx600m" in jvm[0], jvm[0]
    assert "--properties-file" in jvm[0]
    # ...and the secret, exactly, in its conf; in no process's arguments.
    assert report["value"] == secret
    leaked = [argv for argv in report["cmdlines"] if any("s3cr3t" in arg for arg in argv)]
    assert leaked == []
    assert report["private_dirs"] == []  # the properties file is deleted once the JVM is up
