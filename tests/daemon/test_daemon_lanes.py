"""Several consume lanes per shard, on the real stack: each lane a process reading its part
of the shard's partitions, the pipeline thread the WAL's only writer; exactly once through a
leader killed mid-flush. A lane that raises (real lane processes, the next term on the same
WAL) is in `tests/pipeline/test_pipeline_lanes.py`; partitions added while running are
picked up by the lane their rank names (`tests/consumer/test_consumer_metadata.py`, with a
stand-in client: the dev stack's broker, tansu, does not support CreatePartitions)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from devstack.cluster import StackEndpoints
from devstack.records import Produced, create_topic
from devstack.records import produce as produce_records
from tests.commands import edit
from tests.helpers.landing import assert_exactly_once, landed
from tests.helpers.logs import log_events
from tests.helpers.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.slow(seconds=70)]

PARTITIONS = 6
SHARD = [0]


def produce(bootstrap: str, topic: str, count: int, start: int = 0) -> Produced:
    return produce_records(bootstrap, topic, count, partitions=PARTITIONS, start=start)


def lanes_started(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e["event"] == "lanes.started"]


# The other cluster tests read with one lane (`make_cluster`'s default) to keep the suite's
# time; the chaos run reads with two (kills, partitions, a reshard: tests/chaos), the
# reshard test's old leader with three.
def test_two_and_three_lanes_are_exactly_once_through_kills_between_insert_and_checkpoint(
    make_cluster: Any, stack: StackEndpoints, topic_prefix: str, ch_client: Any
) -> None:
    topic = f"{topic_prefix}_events"
    create_topic(stack.kafka, topic, PARTITIONS)
    produced = produce(stack.kafka, topic, 30_000)
    # Followers keep Spark warm: each new leader flushes at once, not after a Spark start.
    cluster = make_cluster(
        {"n1": SHARD, "n2": SHARD}, shard_count=1, lanes=3, spark_on_followers=True
    )
    n1, n2 = cluster.nodes["n1"], cluster.nodes["n2"]
    edit(n2.config_path, r"^lanes = 3$", "lanes = 2")  # lanes are per node
    crash = {"HAKAFKA_CRASH_AT": "flush.after_insert:2"}
    n1.start(env=crash)
    n1.wait_up()
    assert cluster.wait_leaders([0]) == {0: "n1"}
    n2.start(env=crash)  # it dies the same way once it leads
    n2.wait_up()
    wait_for(lambda: landed(ch_client, "events") > 0, 120, "n1's first block")
    # n1's second block dies between its insert and its checkpoint.
    batches = [produced, produce(stack.kafka, topic, 6_000, start=30_000)]
    wait_for(lambda: not n1.alive(), 120, "n1 to die between insert and checkpoint")
    assert [e["lanes"] for e in lanes_started(log_events(n1.log_path))] == [3]
    # n1 again, no crash planned: it follows n2 and leads once n2 dies.
    n1.start()
    n1.wait_up()
    # n2 re-flushes n1's block (adding nothing), reads on with two lanes and dies at its
    # second insert: more rows until it has.
    for chunk in range(8):
        if not n2.alive():
            break
        start = 36_000 + chunk * 3_000
        batches.append(produce(stack.kafka, topic, 3_000, start=start))
        deadline = time.monotonic() + 10.0
        while n2.alive() and time.monotonic() < deadline:
            time.sleep(0.2)
    assert not n2.alive(), "n2 never reached its second insert"
    assert [e["lanes"] for e in lanes_started(log_events(n2.log_path))] == [2]
    # n1, three lanes again, re-flushes n2's block and reads the rest.
    batches.append(produce(stack.kafka, topic, 6_000, start=70_000))
    expected = set().union(*(b.good for b in batches))
    wait_for(lambda: landed(ch_client, "events") >= len(expected), 180, "every row")
    assert_exactly_once(ch_client, "events", expected)
    assert [e["lanes"] for e in lanes_started(log_events(n1.log_path))] == [3, 3]
