"""`hakafka run` processes on the real local stack: exactly once through kills and outages."""

from __future__ import annotations

import json
import signal
import time
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import quote

import pyarrow as pa
import pytest

from buffer.client import query as remote_query
from buffer.formats import encode_arrow
from buffer.push_client import Pusher
from devstack.clickhouse import ClickHouseService
from devstack.cluster import StackEndpoints
from devstack.records import create_topic
from tests.helpers.landing import PARTITIONS, assert_exactly_once, count, landed, produce
from tests.helpers.logs import log_events
from tests.helpers.metrics import metric, samples
from tests.helpers.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.slow]

ALL_SHARDS = [0, 1]


def test_two_shards_two_replicas_exactly_once_through_a_leader_killed_with_its_replica(
    make_cluster: Any, stack: StackEndpoints, topic_prefix: str, ch_client: Any
) -> None:
    # The production layout: each node writes through its own ClickHouse replica (here its
    # own address of the one server), and the node's death takes its replica with it.
    topic = f"{topic_prefix}_events"
    create_topic(stack.kafka, topic, PARTITIONS)
    cluster = make_cluster({"n1": ALL_SHARDS, "n2": ALL_SHARDS}, replica_per_node=True)
    cluster.start()
    leaders = cluster.wait_leaders(ALL_SHARDS)
    first = produce(stack.kafka, topic, 100_000, bad_every=997)
    wait_for(lambda: landed(ch_client, "events") > 10_000, 120, "first flushes")
    victim = leaders[0]
    (survivor,) = set(cluster.nodes) - {victim}
    cluster.nodes[victim].kill(signal.SIGKILL)
    cluster.kill_replica(victim)
    second = produce(stack.kafka, topic, 100_000, start=100_000, bad_every=997)
    good, bad = first.good | second.good, first.bad | second.bad
    assert len(good) + len(bad) == 200_000
    wait_for(lambda: cluster.leaders() == {0: survivor, 1: survivor}, 60, "failover")
    # Every row lands while the dead node's replica is still gone.
    wait_for(lambda: landed(ch_client, "events") >= len(good), 240, "every good row")
    wait_for(
        lambda: count(ch_client, "events_dead_letter") >= len(bad),
        60,
        "every dead letter",
    )
    skipped = [
        e
        for e in log_events(cluster.nodes[survivor].log_path)
        if e.get("event") == "tables.replica_skipped"
    ]
    assert skipped and {e["replica"] for e in skipped} == {victim}, skipped
    cluster.start_replica(victim)
    cluster.nodes[victim].start()
    cluster.nodes[victim].wait_up()
    time.sleep(4)  # one more flush cycle: nothing may arrive twice afterwards
    assert_exactly_once(ch_client, "events", good)
    assert_exactly_once(ch_client, "events_dead_letter", bad)
    errors = ch_client.query("SELECT DISTINCT _error FROM events_dead_letter").result_rows
    assert errors and all(e[0] for e in errors), "every dead letter carries its error text"


def event_names(node: Any) -> list[str]:
    return [e.get("event", "") for e in log_events(node.log_path)]


def test_followers_stand_at_once_and_wait_warm_so_a_new_leader_flushes_without_spark_start(
    make_cluster: Any, stack: StackEndpoints, topic_prefix: str, ch_client: Any
) -> None:
    # The default `spark.on_followers = true`: Spark starts beside standing, not before it.
    topic = f"{topic_prefix}_events"
    create_topic(stack.kafka, topic, PARTITIONS)
    # The in-daemon driver: its JVM's start is what a warm follower spares a new leader.
    cluster = make_cluster(
        {"n1": [0], "n2": [0]}, spark_on_followers=True, spark={"master": "local[2]"}
    )
    cluster.start()
    leader = cluster.nodes[cluster.wait_leaders([0])[0]]
    follower = next(n for n in cluster.nodes.values() if n is not leader)
    first = produce(stack.kafka, topic, 20_000)
    owned = {(p, o) for p, o in first.good if p % 2 == 0}
    wait_for(lambda: landed(ch_client, "events") >= len(owned), 120, "the first rows")
    # The leader was elected before its Spark session was up: start-up does not wait for it.
    names = event_names(leader)
    assert names.index("leader.elected") < names.index("spark.started")
    wait_for(follower.flush_path_warm, 120, "warm")
    # The gauge follows within a main-loop turn (a second).
    wait_for(lambda: metric(follower, "hakafka_flush_ready") == 1.0, 5, "the gauge")
    status = follower.status()["flush_path"]
    assert status["error"] is None and status["warm_up_s"] > 0
    # Elected after a kill -9, the warm follower re-flushes and flushes on the session it has.
    started_before = event_names(follower).count("spark.started")
    leader.kill(signal.SIGKILL)
    second = produce(stack.kafka, topic, 20_000, start=20_000)
    owned |= {(p, o) for p, o in second.good if p % 2 == 0}
    wait_for(lambda: landed(ch_client, "events") >= len(owned), 120, "every row")
    names = event_names(follower)
    assert "leader.elected" in names and names.count("spark.started") == started_before == 1
    assert_exactly_once(ch_client, "events", owned)


# The event each flush step logs just before its crash point, and the field naming the block.
STEP_EVENTS = {
    "flush.after_pending": ("fenced.pending_written", "block"),
    "flush.after_insert": ("flush.written", "block_id"),
    "flush.after_checkpoint": ("fenced.checkpoint_committed", None),
}


def assert_killed_at(node: Any, point: str, nth: int = 2) -> dict[str, Any] | None:
    """`node` died by SIGKILL at the `nth` pass through `point`, not before or after it:
    its log has the step's `nth` event and no commit of that block. Returns that event."""
    assert node.process.exited_with() == -signal.SIGKILL, node.log_tail()
    found = log_events(node.log_path)
    assert not [e for e in found if e["event"] in ("daemon.stopping", "pipeline.failed")]
    if point not in STEP_EVENTS:
        assert [e for e in found if e["event"] == "consumer.assigned"], node.log_tail()
        return None
    name, block_key = STEP_EVENTS[point]
    steps = [e for e in found if e["event"] == name]
    assert len(steps) >= nth, (point, steps)
    step = steps[nth - 1]
    committed = [e for e in found if e["event"] == "flush.committed"]
    if block_key is not None:
        assert step[block_key] not in {e["block"] for e in committed}, step
    else:
        # The checkpoint moved (and the intent went with it), but the flush never finished.
        (offsets,) = step["offsets"].values()
        assert not [
            e for e in committed if e["shard"] == step["shard"] and e["checkpoint"] == offsets
        ], step
    return step


@pytest.mark.parametrize(
    "point",
    ["consume.after_wal", "flush.after_pending", "flush.after_insert", "flush.after_checkpoint"],
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
    wait_for(lambda: not n1.alive(), 180, f"n1 to die at {point}")
    step = assert_killed_at(n1, point)
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
    reflushes = [e for e in log_events(n2.log_path) if e["event"] == "pending.reflush"]
    # n1's WAL is not n2's: whatever n2 re-flushes comes from Kafka.
    assert all(e["source"] == "kafka" for e in reflushes), reflushes
    if point == "flush.after_checkpoint":
        assert step is not None
        # The intent was deleted with the checkpoint commit: nothing of that shard is in doubt.
        assert step["shard"] not in {e["shard"] for e in reflushes}, reflushes
    elif point != "consume.after_wal":
        _, block_key = STEP_EVENTS[point]
        assert step is not None and block_key is not None
        assert step[block_key] in {e["block"] for e in reflushes}, "n1's intent re-flushed"


def test_leader_restarted_after_a_crash_reflushes_its_intent_from_its_own_wal(
    make_cluster: Any, stack: StackEndpoints, topic_prefix: str, ch_client: Any
) -> None:
    topic = f"{topic_prefix}_events"
    create_topic(stack.kafka, topic, PARTITIONS)
    before = produce(stack.kafka, topic, 30_000)
    cluster = make_cluster({"n1": ALL_SHARDS})
    n1 = cluster.nodes["n1"]
    # ClickHouse holds the block, the checkpoint did not move: its rows must not come twice.
    n1.start(env={"HAKAFKA_CRASH_AT": "flush.after_insert:2"})
    n1.wait_up()
    wait_for(lambda: not n1.alive(), 180, "n1 to die at flush.after_insert")
    step = assert_killed_at(n1, "flush.after_insert")
    assert step is not None
    crashed_at = n1.log_path.stat().st_size
    after = produce(stack.kafka, topic, 10_000, start=30_000)
    n1.start()
    n1.wait_up()
    cluster.wait_leaders(ALL_SHARDS)
    wait_for(lambda: landed(ch_client, "events") >= 40_000, 180, "every row")
    time.sleep(4)
    assert_exactly_once(ch_client, "events", before.good | after.good)
    reflushes = [e for e in log_events(n1.log_path, crashed_at) if e["event"] == "pending.reflush"]
    assert step["block_id"] in {e["block"] for e in reflushes}, reflushes
    assert all(e["source"] == "wal" and e["rows"] > 0 for e in reflushes), reflushes
    assert sum(p["refetched_rows"] for p in n1.pipelines()) == 0


def test_restart_replays_the_wal_instead_of_kafka(
    make_cluster: Any, stack: StackEndpoints, topic_prefix: str, ch_client: Any
) -> None:
    topic = f"{topic_prefix}_events"
    create_topic(stack.kafka, topic, PARTITIONS)
    # A shard's block flushes at 12,500 rows, and the records go round-robin to 8 partitions,
    # 4 a shard: the first 20,000 stay in the buffer and the WAL (10,000 a shard), and each
    # shard's rows flush as one block once the last 5,000 come.
    buffer = {"min_rows": 12_500, "max_rows": 100_000, "min_bytes": 1, "min_age": 1, "max_age": 300}
    cluster = make_cluster({"n1": ALL_SHARDS}, buffer=buffer)
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
    wait_for(lambda: landed(ch_client, "events") >= 25_000, 120, "all rows flushed")
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
            "limit_bytes": 2 << 20,  # `limit` below
        },
    )
    node = cluster.nodes["n1"]
    limit = 2 << 20
    cluster.start()
    cluster.wait_leaders(ALL_SHARDS)
    warm = produce(stack.kafka, topic, 2_000)
    wait_for(lambda: landed(ch_client, "events") >= 2_000, 120, "warm-up rows")
    pushed = pa.table({"id": list(range(300)), "kind": ["push"] * 300, "amount": [0.5] * 300})
    insert = urllib.request.Request(
        f"{node.url}/insert?pipeline=events&shard=0&writer=w-outage&sequence=0",
        data=encode_arrow(pushed),
        headers={"Content-Type": "application/vnd.apache.arrow.stream"},
        method="POST",
    )
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
        # Each shard's 50k rows are more than its limit: both pipelines pause.
        wait_for(lambda: metric(node, "hakafka_backpressure") == 2, 60, "both pipelines paused")
        consumed = metric(node, "hakafka_consumed_rows_total")
        for _ in range(3):  # sampled through 9 s more of the outage, over its flush retries
            time.sleep(3)
            assert metric(node, "hakafka_backpressure") == 2
            # A paused pipeline holds its refused batch: not one row more is read.
            assert metric(node, "hakafka_consumed_rows_total") == consumed
            held = samples(node, "hakafka_buffer_bytes")
            assert len(held) == 2 and all(0 < b <= limit for b in held.values()), held
        # A push into the full buffer is refused at once (429, Retry-After), not applied.
        began = time.monotonic()
        try:
            urllib.request.urlopen(insert, timeout=60)
            raise AssertionError("a push into a full buffer was taken")
        except urllib.error.HTTPError as refused:
            assert refused.code == 429, refused.read()
            assert refused.headers["Retry-After"] == "1"
            assert "the buffer is full" in json.loads(refused.read())["message"]
        assert time.monotonic() - began < 10
    finally:
        clickhouse.start()
    # Pushed again once there is room: applied once, nothing of the refused push lost.
    pusher = Pusher(lambda: [node.url], "events", 0, "w-outage", wait_s=240)
    assert pusher.push(0, pushed).rows == 300
    client = clickhouse.client(database=ch_client.database)
    wait_for(
        lambda: count(client, "events") >= 102_300,
        240,
        "every row after the outage",
    )
    time.sleep(4)
    batch = {(-1, i) for i in range(300)}  # the cluster's first writer, sequence 0
    assert_exactly_once(client, "events", warm.good | outage.good | batch)
    assert metric(node, "hakafka_flushes_total") > 0
    assert count(client, "events_dead_letter") == 0


def test_pipelines_consume_while_clickhouse_is_down_and_flush_once_it_is_back(
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
        # Consuming never waits for ClickHouse: both pipelines consume and buffer every row;
        # the flush lane retries the tables and says why in `status`, without restarts.
        wait_for(
            lambda: (
                len(ps := node.pipelines()) == 2
                and all(p["state"] == "consuming" for p in ps)
                and sum(p["buffer_rows"] for p in ps) == len(produced.good)
            ),
            60,
            "both pipelines consuming and buffering while ClickHouse is down",
        )
        wait_for(
            lambda: all("tables failing" in (p["error"] or "") for p in node.pipelines()),
            30,
            "the ClickHouse error in status",
        )
        assert all(p["restarts"] == 0 for p in node.pipelines()), node.pipelines()
    finally:
        clickhouse.start()
    client = clickhouse.client(database=ch_client.database)
    # The tables exist once the errors clear (the flush lane creates them first).
    wait_for(lambda: all(p["error"] is None for p in node.pipelines()), 60, "the errors to clear")
    wait_for(lambda: landed(client, "events") >= 3_000, 120, "the rows produced before")
    time.sleep(2)
    assert_exactly_once(client, "events", produced.good)


def test_a_follower_forwards_http_and_flight_queries_to_the_leaders_buffer(
    make_cluster: Any, stack: StackEndpoints, topic_prefix: str, ch_client: Any
) -> None:
    topic = f"{topic_prefix}_events"
    create_topic(stack.kafka, topic, PARTITIONS)
    # Two nodes serve shard 0; nothing flushes, so its rows are only in the leader's buffer.
    cluster = make_cluster({"n1": [0], "n2": [0]}, buffer={"min_rows": 1_000_000, "max_age": 300})
    cluster.start()
    leader = cluster.nodes[cluster.wait_leaders([0])[0]]
    (follower,) = (n for n in cluster.nodes.values() if n is not leader)
    produced = produce(stack.kafka, topic, 4_000)
    held = {(p, o) for p, o in produced.good if p % 2 == 0}  # shard 0 owns the even partitions
    wait_for(
        lambda: sum(p["buffer_rows"] for p in leader.pipelines()) == len(held),
        120,
        "the leader's buffer to hold shard 0's rows",
    )
    assert count(ch_client, "events") == 0

    flight = f"grpc://127.0.0.1:{follower.flight_port}"
    for url in (follower.url, flight):
        got = remote_query(url, "SELECT _partition, _offset FROM events")
        pairs = list(zip(got["_partition"].to_pylist(), got["_offset"].to_pylist(), strict=True))
        assert len(pairs) == len(held) and set(pairs) == held, url
    sql = quote("SELECT count(*) AS n FROM events")
    code, body = follower.get(f"/query?sql={sql}&format=json")
    assert code == 200, body
    assert json.loads(body)["rows"] == [{"n": len(held)}]
    # Shard 1 is served by no node: the follower waits for a leader (session timeout + 2 s),
    # then says so instead of answering from nothing.
    code, body = follower.get(f"/query?sql={sql}&shard=1", timeout=30.0)
    assert code == 502, body
    message = json.loads(body)["message"]
    assert "shard 1: it has no leader; no next leader answered within 5 s" in message
