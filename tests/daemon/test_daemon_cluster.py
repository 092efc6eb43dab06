"""`hakafka run` processes on the real local stack: exactly once through kills and outages."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from typing import Any

import pytest

from hakafka.devstack.clickhouse import ClickHouseService
from hakafka.devstack.cluster import StackEndpoints
from hakafka.devstack.records import Produced, create_topic, tally
from hakafka.devstack.records import produce as produce_records

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.slow]

ALL_SHARDS = [0, 1]
PARTITIONS = 8


def produce(
    bootstrap: str, topic: str, count: int, *, start: int = 0, bad_every: int = 0
) -> Produced:
    return produce_records(
        bootstrap, topic, count, partitions=PARTITIONS, start=start, bad_every=bad_every
    )


def wait_for(check: Callable[[], bool], timeout: float, what: str, interval: float = 0.5) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def assert_exactly_once(client: Any, table: str, expected: set[tuple[int, int]]) -> None:
    result = tally(client, table, expected)
    assert result.exactly_once, f"{table}: {result}"


def count(client: Any, table: str) -> int:
    return int(client.command(f"SELECT count() FROM {table}"))


def metric(node: Any, name: str) -> float:
    """Sum of a Prometheus metric's samples on one node's /metrics."""
    code, body = node.get("/metrics")
    assert code == 200
    total = 0.0
    for line in body.decode().splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_two_shards_two_replicas_exactly_once_through_a_leader_kill(
    make_cluster: Any, stack: StackEndpoints, topic_prefix: str, ch_client: Any
) -> None:
    topic = f"{topic_prefix}_events"
    create_topic(stack.kafka, topic, PARTITIONS)
    cluster = make_cluster({"n1": ALL_SHARDS, "n2": ALL_SHARDS})
    cluster.start()
    leaders = cluster.wait_leaders(ALL_SHARDS)
    first = produce(stack.kafka, topic, 100_000, bad_every=997)
    wait_for(lambda: count(ch_client, "events") > 10_000, 120, "first flushes")
    victim = leaders[0]
    cluster.nodes[victim].kill(signal.SIGKILL)
    second = produce(stack.kafka, topic, 100_000, start=100_000, bad_every=997)
    good, bad = first.good | second.good, first.bad | second.bad
    assert len(good) + len(bad) == 200_000
    wait_for(
        lambda: cluster.leaders().keys() >= {0, 1} and victim not in cluster.leaders().values(),
        60,
        "failover",
    )
    cluster.nodes[victim].start()
    wait_for(lambda: count(ch_client, "events") >= len(good), 240, "every good row")
    wait_for(
        lambda: count(ch_client, "events_dead_letter") >= len(bad),
        60,
        "every dead letter",
    )
    time.sleep(4)  # one more flush cycle: nothing may arrive twice afterwards
    assert_exactly_once(ch_client, "events", good)
    assert_exactly_once(ch_client, "events_dead_letter", bad)
    errors = ch_client.query("SELECT DISTINCT _error FROM events_dead_letter").result_rows
    assert errors and all(e[0] for e in errors), "every dead letter carries its error text"


@pytest.mark.parametrize(
    "point", ["consume.after_wal", "flush.after_pending", "flush.after_insert"]
)
def test_leader_killed_at_each_protocol_step(
    point: str, make_cluster: Any, stack: StackEndpoints, topic_prefix: str, ch_client: Any
) -> None:
    topic = f"{topic_prefix}_events"
    create_topic(stack.kafka, topic, PARTITIONS)
    produced = produce(stack.kafka, topic, 30_000)
    cluster = make_cluster({"n1": ALL_SHARDS, "n2": ALL_SHARDS})
    n1, n2 = cluster.nodes["n1"], cluster.nodes["n2"]
    n1.start(env={"HAKAFKA_CRASH_AT": f"{point}:2"})
    n1.wait_up()
    # n1 leads both shards alone, then SIGKILLs itself at the planned step.
    wait_for(lambda: not n1.alive(), 120, f"n1 to die at {point}")
    n2.start()
    n2.wait_up()
    wait_for(lambda: set(n2.leads()) == {0, 1}, 60, "n2 to lead both shards")
    wait_for(
        lambda: count(ch_client, "events") >= len(produced.good),
        180,
        "every row",
    )
    time.sleep(4)
    assert_exactly_once(ch_client, "events", produced.good)
    if point != "consume.after_wal":
        # The intent n1 left behind was re-flushed by n2 (from Kafka: n1's WAL is not n2's).
        reflushes = [
            line for line in n2.log_path.read_text().splitlines() if "pending.reflush" in line
        ]
        assert reflushes and all('"source": "kafka"' in line for line in reflushes), reflushes


def test_restart_replays_the_wal_instead_of_kafka(
    make_cluster: Any, stack: StackEndpoints, topic_prefix: str, ch_client: Any
) -> None:
    topic = f"{topic_prefix}_events"
    create_topic(stack.kafka, topic, PARTITIONS)
    # Nothing flushes for 25 s: everything consumed stays in the buffer and the WAL.
    cluster = make_cluster({"n1": ALL_SHARDS}, buffer={"min_rows": 1_000_000, "max_age": 25})
    node = cluster.nodes["n1"]
    cluster.start()
    cluster.wait_leaders(ALL_SHARDS)
    first = produce(stack.kafka, topic, 20_000)
    wait_for(lambda: metric(node, "hakafka_consumed_rows_total") >= 20_000, 60, "20k rows consumed")
    assert count(ch_client, "events") == 0
    node.kill(signal.SIGKILL)
    node.start()
    node.wait_up()
    cluster.wait_leaders(ALL_SHARDS)
    replayed = sum(p["replayed_rows"] for p in node.pipelines())
    assert replayed == 20_000, "the buffer came back from the WAL"
    second = produce(stack.kafka, topic, 5_000, start=20_000)
    wait_for(lambda: count(ch_client, "events") >= 25_000, 120, "all rows flushed")
    # Only the 5k new records were read from Kafka after the restart.
    assert metric(node, "hakafka_consumed_rows_total") == 5_000
    assert_exactly_once(ch_client, "events", first.good | second.good)
    # SIGTERM after both shards flushed: a clean stop, not a SIGKILL at the deadline (Flight's
    # serve() once swapped the signal handlers during flushes and the daemon missed SIGTERM).
    began = time.monotonic()
    node.stop(timeout=30.0)
    assert '"daemon.stopped"' in node.log_path.read_text(), node.log_tail()
    assert time.monotonic() - began < 30.0


def test_clickhouse_down_holds_data_at_the_limit_then_delivers(
    make_cluster: Any,
    stack: StackEndpoints,
    topic_prefix: str,
    ch_client: Any,
    clickhouse: ClickHouseService,
) -> None:
    topic = f"{topic_prefix}_events"
    create_topic(stack.kafka, topic, PARTITIONS)
    cluster = make_cluster(
        {"n1": ALL_SHARDS},
        buffer={
            "min_rows": 1000,
            "max_rows": 20_000,
            "min_bytes": 1,
            "max_bytes": 1 << 20,
            "min_age": 1,
            "max_age": 2,
            "limit_bytes": 2 << 20,
        },
    )
    node = cluster.nodes["n1"]
    cluster.start()
    cluster.wait_leaders(ALL_SHARDS)
    warm = produce(stack.kafka, topic, 2_000)
    wait_for(lambda: count(ch_client, "events") >= 2_000, 120, "warm-up rows")
    clickhouse.stop()
    try:
        outage = produce(stack.kafka, topic, 100_000, start=2_000)
        wait_for(
            lambda: metric(node, "hakafka_backpressure") >= 1,
            60,
            "consumption paused at the buffer limit",
        )
        assert metric(node, "hakafka_consumed_rows_total") < 102_000, (
            "paused before reading everything"
        )
        time.sleep(30)
    finally:
        clickhouse.start()
    client = clickhouse.client(database=ch_client.database)
    wait_for(
        lambda: count(client, "events") >= 102_000,
        240,
        "every row after the outage",
    )
    time.sleep(4)
    assert_exactly_once(client, "events", warm.good | outage.good)
    assert metric(node, "hakafka_flushes_total") > 0
    assert count(client, "events_dead_letter") == 0


def test_pipeline_failed_in_recovery_restarts_once_clickhouse_is_back(
    make_cluster: Any,
    stack: StackEndpoints,
    topic_prefix: str,
    ch_client: Any,
    clickhouse: ClickHouseService,
) -> None:
    topic = f"{topic_prefix}_events"
    create_topic(stack.kafka, topic, PARTITIONS)
    cluster = make_cluster({"n1": ALL_SHARDS})
    node = cluster.nodes["n1"]
    produced = produce(stack.kafka, topic, 3_000)
    clickhouse.stop()
    try:
        cluster.start()
        # Recovery needs ClickHouse (tables, replicas): each pipeline fails, says why, and
        # its shard restarts it instead of leaving it failed for the rest of the term.
        wait_for(
            lambda: len(ps := node.pipelines()) == 2 and all(p["restarts"] >= 2 for p in ps),
            60,
            "two restarts of each pipeline while ClickHouse is down",
        )
        errors = {p["error"] for p in node.pipelines() if p["state"] == "failed"}
        assert None not in errors, node.pipelines()
    finally:
        clickhouse.start()
    client = clickhouse.client(database=ch_client.database)
    wait_for(
        lambda: [p["state"] for p in node.pipelines()] == ["consuming", "consuming"],
        90,
        "both pipelines consuming after the outage",
    )
    wait_for(lambda: count(client, "events") >= 3_000, 120, "the rows produced before")
    time.sleep(2)
    assert_exactly_once(client, "events", produced.good)
