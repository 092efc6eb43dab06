"""Signals of a real `hakafka run` process: SIGHUP reopens the log file, SIGINT stops cleanly
and releases leadership, a second SIGTERM during a slow shutdown exits at once. Throughout,
with `--log-file` nothing reaches the process's stdout or stderr: not Spark's banners, log4j
lines or Python workers' output, not librdkafka's lines (they are debug events in the file)."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient

from devstack.cluster import DaemonNode, StackEndpoints
from devstack.process import wait_until
from devstack.records import create_topic, produce
from hakafka.coordination import paths
from hakafka.daemon import SHUTDOWN_BOUND_S

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.slow]

SHARD = 0
PARTITIONS = 4  # shard 0 of 2 owns partitions 0 and 2


def log_text(path: Path, offset: int = 0) -> str:
    """The JSON log at `path` from byte `offset` on ("" while the file does not exist)."""
    try:
        with path.open("rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")
    except FileNotFoundError:
        return ""


def process_output(node: DaemonNode) -> str:
    """What the daemon process wrote to its stdout and stderr (devstack keeps both in one
    file, across restarts)."""
    return log_text(node.log_path)


def events(text: str, name: str) -> int:
    """How many log lines of `text` are the event `name`."""
    return text.count(f'"event": "{name}"')


def test_sighup_reopens_the_log_sigint_stops_cleanly_second_sigterm_exits_at_once(
    make_cluster: Any, stack: StackEndpoints, topic_prefix: str, zk_root: str
) -> None:
    topic = f"{topic_prefix}_events"
    create_topic(stack.kafka, topic, PARTITIONS)
    # The in-daemon driver: its JVM's output is part of what goes to the log file.
    cluster = make_cluster({"n1": [SHARD]}, spark={"master": "local[2]"})
    node = cluster.nodes["n1"]
    log_file = node.root / "n1-events.log"
    log_args = ["--log-file", str(log_file)]
    node.start(args=log_args)
    node.wait_up()
    cluster.wait_leaders([SHARD])
    produce(stack.kafka, topic, 1_000, partitions=PARTITIONS)
    # The first flush waits for Spark to start: slow on a busy machine.
    wait_until(
        lambda: events(log_text(log_file), "flush.committed") >= 1,
        timeout=180,
        what="a first flush",
    )

    # logrotate moves the file, then SIGHUP: later events go to a new file at the old path.
    rotated = log_file.with_name(log_file.name + ".1")
    log_file.rename(rotated)
    node.kill(signal.SIGHUP)
    wait_until(
        lambda: events(log_text(log_file), "daemon.logs_reopened") == 1,
        timeout=10,
        what="the reopened log",
    )
    rotated_size = rotated.stat().st_size
    produce(stack.kafka, topic, 1_000, partitions=PARTITIONS, start=1_000)
    wait_until(
        lambda: events(log_text(log_file), "flush.committed") >= 1,
        timeout=120,
        what="a flush in the new log",
    )
    assert node.alive()
    assert rotated.stat().st_size == rotated_size, "nothing written to the moved file"
    old = log_text(rotated)
    assert events(old, "daemon.started") == 1 and events(old, "daemon.logs_reopened") == 0

    # SIGINT: the same clean stop as SIGTERM, and the shard's leader znode is deleted, not left
    # to expire with the session (a crashed daemon's would stay for the 3 s session timeout).
    zk = KazooClient(hosts=stack.zookeeper, timeout=10.0)
    zk.start(timeout=10)
    try:
        leader_path = f"{zk_root}{paths.leader(SHARD)}"
        assert zk.exists(leader_path) is not None
        sent = time.monotonic()
        node.kill(signal.SIGINT)
        assert node.wait_exit(timeout=45) == 0, log_text(log_file)[-3000:]
        exited = time.monotonic()
        assert zk.exists(leader_path) is None, "leadership released before the exit"
        assert zk.exists(f"{zk_root}{paths.node('n1')}") is None
        assert time.monotonic() - exited < 1.0, "checked well within the session timeout"
    finally:
        zk.stop()
        zk.close()
    assert exited - sent < SHUTDOWN_BOUND_S
    text = log_text(log_file)
    assert '"signal": "SIGINT"' in text and events(text, "daemon.stopped") == 1
    # Two flushes went through Spark; every library line went to the file, or nowhere.
    assert process_output(node) == ""

    # A flush that hangs after its intent keeps the first SIGTERM's shutdown waiting (up to
    # the 20 s flush grace); the second SIGTERM exits at once, with code 1.
    # At debug, Spark's output is in the file as `spark.output` events.
    offset = log_file.stat().st_size
    node.start(
        env={"HAKAFKA_HANG_AT": "flush.after_pending"}, args=[*log_args, "--log-level", "debug"]
    )
    node.wait_up()
    cluster.wait_leaders([SHARD])
    produce(stack.kafka, topic, 1_000, partitions=PARTITIONS, start=2_000)
    wait_until(
        lambda: events(log_text(log_file, offset), "fenced.pending_written") == 1,
        timeout=180,
        what="a flush in flight",
    )
    node.kill(signal.SIGTERM)
    wait_until(
        lambda: events(log_text(log_file, offset), "daemon.stopping") == 1,
        timeout=10,
        what="stopping",
    )
    time.sleep(2.0)
    assert node.alive(), "the first shutdown waits for the flush in flight"
    sent = time.monotonic()
    node.kill(signal.SIGTERM)
    assert node.wait_exit(timeout=15) == 1
    assert time.monotonic() - sent < 5.0
    text = log_text(log_file, offset)
    assert events(text, "daemon.exit_now") == 1 and events(text, "daemon.stopped") == 0
    assert events(text, "spark.output") >= 1 and '"level": "debug"' in text
    assert process_output(node) == ""
