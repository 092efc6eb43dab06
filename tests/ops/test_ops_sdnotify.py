"""sd_notify on a real NOTIFY_SOCKET: READY, WATCHDOG while healthy (not once a pipeline is
stuck), STATUS with role and lag, STOPPING at shutdown."""

from __future__ import annotations

import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devstack.cluster import StackEndpoints
from devstack.records import create_topic, produce
from tests.helpers.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]


class NotifySocket:
    """A NOTIFY_SOCKET as systemd has it: every datagram received, with its arrival time."""

    def __init__(self) -> None:
        self._dir = Path(tempfile.mkdtemp(prefix="hk", dir="/tmp"))  # AF_UNIX paths are short
        self.path = str(self._dir / "notify")
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.bind(self.path)
        self._sock.settimeout(0.2)
        self.received: list[tuple[float, str]] = []
        self._done = threading.Event()
        self._reader = threading.Thread(target=self._receive, daemon=True)
        self._reader.start()

    def _receive(self) -> None:
        while not self._done.is_set():
            try:
                self.received.append((time.monotonic(), self._sock.recv(4096).decode()))
            except TimeoutError:
                continue

    def env(self) -> dict[str, str]:
        """What systemd gives a Type=notify service with WatchdogSec=1."""
        return {"NOTIFY_SOCKET": self.path, "WATCHDOG_USEC": "1000000"}

    def pings_after(self, since: float) -> list[str]:
        return [m for t, m in self.received if t > since and "WATCHDOG=1" in m]

    def close(self) -> None:
        self._done.set()
        self._reader.join(5)
        self._sock.close()
        shutil.rmtree(self._dir, ignore_errors=True)


@pytest.fixture
def notify() -> Iterator[NotifySocket]:
    sock = NotifySocket()
    try:
        yield sock
    finally:
        sock.close()


def test_notify_order_and_watchdog_stops_when_a_pipeline_fails(
    make_cluster: Any, stack: StackEndpoints, topic_prefix: str, notify: NotifySocket
) -> None:
    topic = f"{topic_prefix}_events"
    create_topic(stack.kafka, topic, 8)
    cluster = make_cluster(
        {"n1": [0, 1]}, buffer={"min_rows": 1_000_000, "max_age": 300}, on_error="fail"
    )
    node = cluster.nodes["n1"]
    received = notify.received
    node.start(env=notify.env())
    node.wait_up()
    cluster.wait_leaders([0, 1])
    wait_for(lambda: sum("WATCHDOG=1" in m for _, m in received) >= 3, 30, "3 pings", interval=0.2)
    first = received[0][1].splitlines()
    assert "READY=1" in first and f"MAINPID={node.pid}" in first
    # READY comes once the node runs; it stands for election right after (not before).
    assert any(line.startswith("STATUS=shard 0: ") for line in first), first
    wait_for(
        lambda: any("STATUS=shard 0: leader" in m for _, m in received), 30, "leading", interval=0.2
    )
    wait_for(
        lambda: any("lag 0" in m for _, m in received), 30, "STATUS with the lag", interval=0.2
    )

    produce(stack.kafka, topic, 10, partitions=8, bad_every=10)  # #9 is malformed
    wait_for(
        lambda: any(p["state"] == "failed" for p in node.pipelines()),
        60,
        "the pipeline to fail on the malformed message",
        interval=0.2,
    )
    failed_at = time.monotonic()
    assert node.get("/ready")[0] == 503
    time.sleep(5)
    assert notify.pings_after(failed_at + 1.0) == [], "no watchdog ping once a pipeline failed"
    # A bad message under on_error="fail" waits for ops: never restarted into a loop.
    stuck = [p for p in node.pipelines() if not p["restartable"]]
    assert [(p["state"], p["restarts"]) for p in stuck] == [("failed", 0)], stuck
    assert "offset" in stuck[0]["error"], stuck[0]["error"]
    assert any(t > failed_at + 1.0 and "STATUS=" in m for t, m in received)
    node.stop()
    time.sleep(0.5)
    messages = [m for _, m in received]
    stopping = [i for i, m in enumerate(messages) if "STOPPING=1" in m]
    assert len(stopping) == 1 and stopping[0] >= len(messages) - 2, messages[-3:]
    assert not any("READY=1" in m for m in messages[1:])


def test_watchdog_stops_while_a_pipeline_hangs(
    make_cluster: Any, stack: StackEndpoints, topic_prefix: str, notify: NotifySocket
) -> None:
    """A pipeline thread blocked for good (here: right after its WAL append, as on a hung
    disk) is alive and `consuming`, yet the node is not ready and systemd's watchdog starves."""
    topic = f"{topic_prefix}_events"
    create_topic(stack.kafka, topic, 8)
    cluster = make_cluster(
        {"n1": [0, 1]}, buffer={"min_rows": 1_000_000, "max_age": 300}, server={"stuck_after": 3}
    )
    node = cluster.nodes["n1"]
    node.start(env={**notify.env(), "HAKAFKA_HANG_AT": "consume.after_wal"})
    node.wait_up()
    cluster.wait_leaders([0, 1])
    wait_for(lambda: len(notify.pings_after(0.0)) >= 3, 30, "3 pings", interval=0.2)
    assert node.get("/ready")[0] == 200

    produce(stack.kafka, topic, 100, partitions=8)
    wait_for(
        lambda: node.get("/ready")[0] == 503,
        30,
        "the node to report a stuck pipeline",
        interval=0.2,
    )
    stuck_at = time.monotonic()
    pipelines = node.pipelines()
    assert [p["state"] for p in pipelines] == ["consuming", "consuming"]  # alive, not failed
    assert max(p["stalled_s"] for p in pipelines) >= 3, pipelines
    time.sleep(4)
    assert notify.pings_after(stuck_at + 1.0) == [], "no watchdog ping while a pipeline hangs"
    assert '"event": "pipeline.stuck"' in node.log_tail(200)
