"""Several consume lanes per shard, on the real stack: each lane a process reading its part
of the shard's partitions, the pipeline thread the WAL's only writer; exactly once through a
leader killed mid-flush. A lane that raises (real lane processes, the next term on the same
WAL) is in `tests/pipeline/test_pipeline_lanes.py`; partitions added while running are
picked up by the lane their rank names (`tests/consumer/test_consumer_metadata.py`, with a
stand-in client: the dev stack's broker, tansu, does not support CreatePartitions)."""

from __future__ import annotations

from typing import Any

import pytest

from devstack.cluster import StackEndpoints
from devstack.records import create_topic
from devstack.records import produce as produce_records
from tests.helpers.landing import assert_exactly_once, landed
from tests.helpers.logs import log_events
from tests.helpers.waiting import wait_for

PARTITIONS = 6
SHARD = [0]


def lanes_started(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e["event"] == "lanes.started"]


# Two lanes are the chaos run's (kills, partitions, a reshard: tests/chaos) and the CLI
# cluster test's; the other cluster tests read with one (`make_cluster`'s default) to keep
# the suite's time.
@pytest.mark.parametrize("lanes", [3])
def test_lanes_deliver_exactly_once_through_a_leader_killed_between_insert_and_checkpoint(
    lanes: int, make_cluster: Any, stack: StackEndpoints, topic_prefix: str, ch_client: Any
) -> None:
    topic = f"{topic_prefix}_events"
    create_topic(stack.kafka, topic, PARTITIONS)
    produced = produce_records(stack.kafka, topic, 30_000, partitions=PARTITIONS)
    cluster = make_cluster({"n1": SHARD, "n2": SHARD}, shard_count=1, lanes=lanes)
    n1, n2 = cluster.nodes["n1"], cluster.nodes["n2"]
    n1.start(env={"HAKAFKA_CRASH_AT": "flush.after_insert:2"})
    n1.wait_up()
    wait_for(lambda: landed(ch_client, "events") > 0, 120, "n1's first block")
    # The second block dies between its insert and its checkpoint.
    more = produce_records(stack.kafka, topic, 6_000, partitions=PARTITIONS, start=30_000)
    wait_for(lambda: not n1.alive(), 120, "n1 to die between insert and checkpoint")
    started = lanes_started(log_events(n1.log_path))
    assert started and started[0]["lanes"] == lanes, started
    n2.start()
    n2.wait_up()
    # n1's last block is in ClickHouse already: n2 re-flushes it (adding nothing) and reads on.
    last = produce_records(stack.kafka, topic, 6_000, partitions=PARTITIONS, start=36_000)
    expected = produced.good | more.good | last.good
    wait_for(lambda: landed(ch_client, "events") >= len(expected), 180, "every row")
    assert_exactly_once(ch_client, "events", expected)
    assert lanes_started(log_events(n2.log_path))[0]["lanes"] == lanes
