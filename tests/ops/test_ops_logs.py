"""Log lines: JSON events by default, console lines on request, and the stdlib loggers of
kazoo and py4j in the same format and sink (one process per case: logging is per process)."""

from __future__ import annotations

import json
import subprocess
import sys

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
