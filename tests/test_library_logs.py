"""Libraries never write to the process's stdout or stderr on their own: librdkafka's log lines
and Python warnings are debug events in the log's sink, and a broker outage is one warning of
hakafka's. One process per case: logging is per process. No broker: the consumer's is a
closed port."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

EMIT = """
import time, warnings
from hakafka.consumer import PartitionConsumer
from hakafka.logs import configure
configure("json", {level!r})
consumer = PartitionConsumer("127.0.0.1:1", "events", [0])
began = time.monotonic()
while time.monotonic() - began < 1.5:
    consumer.consume(timeout=0.2)
consumer.close()
warnings.warn("a library's deprecation note", DeprecationWarning, stacklevel=1)
"""


def run(level: str) -> list[dict[str, object]]:
    """The events a consumer of an unreachable broker writes at log level `level`."""
    done = subprocess.run(
        [sys.executable, "-W", "always", "-c", EMIT.format(level=level)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == "", "a library wrote to stderr"
    return [json.loads(line) for line in done.stdout.splitlines()]


def test_at_debug_library_lines_are_debug_events() -> None:
    events = run("debug")
    kafka = [e for e in events if e["event"] == "librdkafka.log"]
    assert kafka, events
    assert {e["level"] for e in kafka} == {"debug"}
    assert any("Connect to ipv4#127.0.0.1:1 failed" in str(e["line"]) for e in kafka)
    assert {e["library_level"] for e in kafka} >= {"error"}
    down = [e for e in events if e["event"] == "consumer.brokers_down"]
    assert [(e["level"], e["topic"], e["error"]) for e in down] == [
        ("warning", "events", "1/1 brokers are down")
    ]
    warned = [e for e in events if e["event"] == "python.warning"]
    assert len(warned) == 1 and warned[0]["level"] == "debug"
    assert "a library's deprecation note" in str(warned[0]["line"])


@pytest.mark.parametrize("level", ["info", "warning"])
def test_above_debug_an_outage_is_one_warning(level: str) -> None:
    assert [e["event"] for e in run(level)] == ["consumer.brokers_down"]
