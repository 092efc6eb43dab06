"""Log lines: JSON events by default, console lines on request, and the stdlib loggers of
kazoo and py4j in the same format and sink (one process per case: logging is per process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

EMIT = """
import logging, structlog
from hakafka.logs import configure
configure({fmt!r})
structlog.get_logger("hakafka.pipeline").info("flush.committed", rows=5, block="b1")
logging.getLogger("kazoo.client").warning("Connection dropped: %s", "socket closed")
logging.getLogger("kazoo.client").info("below the stdlib threshold")
"""


def emit(fmt: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", EMIT.format(fmt=fmt)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""  # stdlib records go to the same sink, not to stderr
    return done.stdout.splitlines()


def test_json_lines_carry_event_and_fields() -> None:
    lines = emit("json")
    assert len(lines) == 2, lines
    flush, kazoo = (json.loads(line) for line in lines)
    assert {k: flush[k] for k in ("event", "level", "rows", "block")} == {
        "event": "flush.committed",
        "level": "info",
        "rows": 5,
        "block": "b1",
    }
    assert {k: kazoo[k] for k in ("event", "level", "logger")} == {
        "event": "Connection dropped: socket closed",
        "level": "warning",
        "logger": "kazoo.client",
    }
    assert flush["timestamp"].endswith("Z") and kazoo["timestamp"].endswith("Z")


def test_console_lines_are_for_humans() -> None:
    lines = emit("console")
    assert len(lines) == 2, lines
    for line in lines:
        with pytest.raises(json.JSONDecodeError):
            json.loads(line)
    assert "[info" in lines[0] and "flush.committed" in lines[0] and "rows=5" in lines[0]
    assert "[warning" in lines[1] and "Connection dropped: socket closed" in lines[1]
    assert "kazoo.client" in lines[1]


JOURNAL = """
import structlog
from hakafka.logs import LogSink, configure
sink = configure("json")
log = structlog.get_logger("hakafka.daemon")
log.error("flush.failed", block="b1")
log.warning("settings.drift")
log.info("leader.elected")
sink.emergency("daemon.stuck", "critical", thread="flush")
"""


def test_lines_to_the_journal_carry_their_syslog_priority(tmp_path: Path) -> None:
    # systemd names the journal stream in JOURNAL_STREAM (device:inode of stdout); a file
    # stands in for it here. Without the prefix `journalctl -p err` could not find errors.
    out = tmp_path / "journal"
    with out.open("w") as stdout:
        found = os.fstat(stdout.fileno())
        env = {**os.environ, "JOURNAL_STREAM": f"{found.st_dev}:{found.st_ino}"}
        done = subprocess.run(
            [sys.executable, "-c", JOURNAL],
            stdout=stdout,
            stderr=subprocess.PIPE,
            env=env,
            text=True,
            timeout=60,
            check=False,
        )
    assert done.returncode == 0, done.stderr
    lines = out.read_text().splitlines()
    assert [(line[:3], json.loads(line[3:])["event"]) for line in lines] == [
        ("<3>", "flush.failed"),
        ("<4>", "settings.drift"),
        ("<6>", "leader.elected"),
        ("<2>", "daemon.stuck"),
    ]
    # Another stream (a terminal, a pipe, --log-file) gets plain JSON lines.
    elsewhere = subprocess.run(
        [sys.executable, "-c", JOURNAL],
        capture_output=True,
        env=env,
        text=True,
        timeout=60,
        check=False,
    )
    assert [json.loads(line)["event"] for line in elsewhere.stdout.splitlines()] == [
        "flush.failed",
        "settings.drift",
        "leader.elected",
        "daemon.stuck",
    ]
