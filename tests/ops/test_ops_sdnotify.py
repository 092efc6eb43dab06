"""sd_notify on a real NOTIFY_SOCKET: READY, WATCHDOG while healthy (not once a pipeline is
stuck), STATUS with role and lag, STOPPING at shutdown."""

from __future__ import annotations

import shutil
import socket
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from hakafka.devstack.cluster import StackEndpoints
from hakafka.devstack.records import create_topic, produce

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def wait_for(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.2)


def test_notify_order_and_watchdog_stops_when_a_pipeline_fails(
    make_cluster: Any, stack: StackEndpoints, topic_prefix: str
) -> None:
    topic = f"{topic_prefix}_events"
    create_topic(stack.kafka, topic, 8)
    cluster = make_cluster(
        {"n1": [0, 1]}, buffer={"min_rows": 1_000_000, "max_age": 300}, on_error="fail"
    )
    node = cluster.nodes["n1"]
    short = Path(tempfile.mkdtemp(prefix="hk", dir="/tmp"))  # AF_UNIX paths are short
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(short / "notify"))
    sock.settimeout(0.2)
    received: list[tuple[float, str]] = []
    done = threading.Event()

    def receive() -> None:
        while not done.is_set():
            try:
                received.append((time.monotonic(), sock.recv(4096).decode()))
            except TimeoutError:
                continue

    reader = threading.Thread(target=receive, daemon=True)
    reader.start()
    try:
        node.start(env={"NOTIFY_SOCKET": str(short / "notify"), "WATCHDOG_USEC": "1000000"})
        node.wait_up()
        cluster.wait_leaders([0, 1])
        wait_for(lambda: sum("WATCHDOG=1" in m for _, m in received) >= 3, 30, "3 pings")
        first = received[0][1].splitlines()
        assert "READY=1" in first and f"MAINPID={node.pid}" in first
        assert any(line.startswith("STATUS=shard 0: leader") for line in first), first
        wait_for(lambda: any("lag 0" in m for _, m in received), 30, "STATUS with the lag")

        produce(stack.kafka, topic, 10, partitions=8, bad_every=10)  # #9 is malformed
        wait_for(
            lambda: any(p["state"] == "failed" for p in node.pipelines()),
            60,
            "the pipeline to fail on the malformed message",
        )
        failed_at = time.monotonic()
        assert node.get("/ready")[0] == 503
        time.sleep(5)
        late = [m for t, m in received if t > failed_at + 1.0 and "WATCHDOG=1" in m]
        assert late == [], "no watchdog ping while a pipeline is stuck"
        # A bad message under on_error="fail" waits for ops: never restarted into a loop.
        stuck = [p for p in node.pipelines() if not p["restartable"]]
        assert [(p["state"], p["restarts"]) for p in stuck] == [("failed", 0)], stuck
        assert "offset" in stuck[0]["error"], stuck[0]["error"]
        assert any(t > failed_at + 1.0 and "STATUS=" in m for t, m in received)
        node.stop()
        time.sleep(0.5)
    finally:
        done.set()
        reader.join(5)
        sock.close()
        shutil.rmtree(short, ignore_errors=True)
    messages = [m for _, m in received]
    stopping = [i for i, m in enumerate(messages) if "STOPPING=1" in m]
    assert len(stopping) == 1 and stopping[0] >= len(messages) - 2, messages[-3:]
    assert not any("READY=1" in m for m in messages[1:])
