"""Offsets without a message, end to end: a `hakafka run` node reads a topic written by a
transactional producer (each commit leaves a marker offset; an aborted transaction's records
are never read), crashes with a block inserted but not committed, and after a restart
replays and re-flushes across the markers from its own WAL: every committed record once,
nothing read from Kafka again, the checkpoint at the log's end.

The gap is made with transactions because the local broker (tansu) supports them and has
no DeleteRecords (its compaction is not on demand either)."""

from __future__ import annotations

import signal
import time
from typing import Any

import pytest

from devstack.cluster import StackEndpoints
from devstack.records import create_topic, event
from hakafka.consumer import PartitionConsumer
from tests.helpers.landing import assert_exactly_once, landed
from tests.helpers.logs import log_events
from tests.helpers.metrics import metric
from tests.helpers.waiting import wait_for
from tests.transactions import produce_transactions

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.slow]

SHARDS = [0, 1]
PARTITIONS = 2  # partition p belongs to shard p
PER_PARTITION = 200  # records of one transaction in each partition


def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    """Each partition's end (high watermark), read by consuming to it."""
    consumer = PartitionConsumer(bootstrap, topic, list(range(PARTITIONS)))
    try:
        consumer.assign(dict.fromkeys(range(PARTITIONS), 0))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            consumer.consume(10_000, 0.2)
            high = consumer.high_watermarks()
            if len(high) == PARTITIONS and consumer.position() == high:
                return high
        raise AssertionError(f"{topic}: never read to the end: {consumer.position()}")
    finally:
        consumer.close()


def test_replay_and_reflush_cross_transaction_markers_exactly_once(
    make_cluster: Any, stack: StackEndpoints, topic_prefix: str, ch_client: Any
) -> None:
    topic = f"{topic_prefix}_events"
    create_topic(stack.kafka, topic, PARTITIONS)
    # Nothing is sealed until 25 s after the first row: every transaction is consumed first.
    cluster = make_cluster(
        {"n1": SHARDS}, buffer={"min_rows": 1_000_000, "min_bytes": 1, "min_age": 1, "max_age": 25}
    )
    node = cluster.nodes["n1"]
    # The first block to reach ClickHouse kills the node before its checkpoint.
    node.start(env={"HAKAFKA_CRASH_AT": "flush.after_insert:1"})
    node.wait_up()
    cluster.wait_leaders(SHARDS)
    wait_for(
        lambda: len(ps := node.pipelines()) == 2 and all(p["state"] == "consuming" for p in ps),
        60,
        "both pipelines consuming",
    )
    committed: list[tuple[int, int]] = []
    for n in range(6):
        records = [
            (p, event(n * 1000 + p * PER_PARTITION + i))
            for i in range(PER_PARTITION)
            for p in range(PARTITIONS)
        ]
        # One transaction at a time, each read before the next: its marker falls between
        # two WAL records.
        committed += produce_transactions(
            stack.kafka, topic, [(records, n != 2)], transactional_id=f"{topic}-{n}"
        )
        wait_for(
            lambda: metric(node, "hakafka_consumed_rows_total") == len(committed),  # noqa: B023
            60,
            f"transaction {n} consumed: {len(committed)} rows in all",
            seen=lambda: {
                "consumed": metric(node, "hakafka_consumed_rows_total"),
                "end_offsets": end_offsets(stack.kafka, topic),
                "pipelines": [(p["state"], p["error"]) for p in node.pipelines()],
            },
        )
    assert len(committed) == 5 * PARTITIONS * PER_PARTITION
    ends = end_offsets(stack.kafka, topic)
    assert all(ends[p] > max(o for q, o in committed if q == p) + 1 for p in ends), (
        "markers lie between and after the transactions",
        ends,
    )
    wait_for(lambda: not node.alive(), 60, "the node to die at flush.after_insert")
    assert node.process.exited_with() == -signal.SIGKILL, node.log_tail()
    crashed_at = node.log_path.stat().st_size

    node.start()
    node.wait_up()
    cluster.wait_leaders(SHARDS)
    wait_for(lambda: landed(ch_client, "events") >= len(committed), 180, "every committed row")

    def checkpoint() -> dict[int, int]:
        merged: dict[int, int] = {}
        for p in node.pipelines():
            merged.update({int(k): v for k, v in (p["checkpoint"] or {}).items()})
        return merged

    # The trailing markers can come after the last rows' block was sealed: a block of their
    # own then, sealed at max_age (25 s) and flushed, which took over 60 s once under make
    # test's load.
    wait_for(lambda: checkpoint() == ends, 150, f"the checkpoint at the end offsets {ends}")
    # Everything came back from this node's WAL, across the markers: the pending block
    # (re-flushed from it) and the rest (replayed); nothing was read from Kafka again.
    events = log_events(node.log_path, crashed_at)
    reflushes = [e for e in events if e["event"] == "pending.reflush"]
    assert reflushes and all(e["source"] == "wal" for e in reflushes), reflushes
    pipelines = node.pipelines()
    assert sum(p["refetched_rows"] for p in pipelines) == 0
    assert metric(node, "hakafka_consumed_rows_total") == 0
    reflushed = sum(e["rows"] for e in reflushes)
    assert reflushed + sum(p["replayed_rows"] for p in pipelines) == len(committed)
    time.sleep(4)  # one more flush cycle: nothing may arrive twice afterwards
    assert_exactly_once(ch_client, "events", set(committed))
