"""`hakafka reshard` from two shards to three while data flows: `hakafka run` processes on the
real local stack, the old layout's leader reading with three lanes per shard. Every produced
offset lands in ClickHouse exactly once, and no partition is read by two leaders (the old
layout's leader stopped reading before the new one began)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from kazoo.client import KazooClient

from devstack.chaos.checks import event_time, log_events
from devstack.cluster import LocalCluster, StackEndpoints
from devstack.process import wait_until
from devstack.records import Load, create_topic, tally
from hakafka.coordination import paths
from tests.commands import edit, hakafka
from tests.helpers.landing import assert_exactly_once

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.slow]

PARTITIONS = 6


def checkpoints(stack: StackEndpoints, zk_root: str, shards: int) -> dict[int, dict[int, int]]:
    """shard -> {partition: next offset} of pipeline `events`."""
    import json

    zk = KazooClient(hosts=stack.zookeeper)
    zk.start(timeout=10)
    try:
        found: dict[int, dict[int, int]] = {}
        for shard in range(shards):
            path = f"{zk_root}{paths.checkpoint(shard, 'events')}"
            if zk.exists(path):
                (topic,) = json.loads(zk.get(path)[0]).values()
                found[shard] = {int(p): int(o) for p, o in topic.items()}
        return found
    finally:
        zk.stop()
        zk.close()


def test_a_reshard_from_two_to_three_shards_under_load_is_exactly_once(
    make_cluster: Any, stack: StackEndpoints, topic_prefix: str, zk_root: str, ch_client: Any
) -> None:
    topic = f"{topic_prefix}_events"
    create_topic(stack.kafka, topic, PARTITIONS)
    cluster: LocalCluster = make_cluster({"n1": [0, 1], "n2": [0, 1]})
    n1, n2 = cluster.nodes["n1"], cluster.nodes["n2"]
    # n2 is deployed with the new layout already: it waits (its settings differ from the
    # record) until the reshard records them.
    edit(n2.config_path, r"^shard_count = 2$", "shard_count = 3")
    edit(n2.config_path, r"^shards = \[0, 1\]$", "shards = [0, 1, 2]")
    edit(
        n2.config_path,
        r"^(\[clickhouse\.replicas\.1\]\n(?:.+\n)+)",
        f'\\1\n[clickhouse.replicas.2]\nn2 = "{stack.clickhouse}"\n',
    )
    # n1, which leads the old layout, reads each shard's three partitions with three lanes:
    # its lanes drain for the reshard (n2 reads with one; lanes are per node).
    edit(n1.config_path, r"^lanes = 1$", "lanes = 3")
    initialized = hakafka("init", "--config", str(n1.config_path))
    assert initialized.code == 0, initialized.err
    cluster.start()
    assert cluster.wait_leaders([0, 1]) == {0: "n1", 1: "n1"}
    load = Load(stack.kafka, topic, PARTITIONS)
    load.start()
    try:
        wait_until(
            lambda: len(checkpoints(stack, zk_root, 2)) == 2, timeout=90, what="both shards flushed"
        )
        requested = time.time()
        resharded = hakafka("reshard", "--config", str(n2.config_path), "--timeout", "120")
        assert resharded.code == 0, resharded.out + resharded.err
        assert "resharded to 3 shards" in resharded.out
        assert "shard 0: drained by n1" in resharded.out
        assert cluster.wait_leaders([0, 1, 2]) == {0: "n2", 1: "n2", 2: "n2"}
        time.sleep(3.0)  # the new layout consumes under load too
    finally:
        load.stop()
    produced = load.produced.good
    assert len(produced) >= 6_000
    wait_until(
        lambda: tally(ch_client, "events", produced).missing == 0,
        timeout=120,
        what="every produced record in ClickHouse",
    )
    assert_exactly_once(ch_client, "events", produced)
    # Every partition's checkpoint is in the one shard that owns it now, at its end.
    ends: dict[int, int] = {}
    for p, o in produced:
        ends[p] = max(ends.get(p, 0), o + 1)
    assert checkpoints(stack, zk_root, 3) == {
        s: {p: ends[p] for p in range(PARTITIONS) if p % 3 == s} for s in range(3)
    }
    # No partition was read by two leaders: n1's last read ended before n2's first began.
    n1_stopped = [
        event_time(e["timestamp"])
        for e in log_events(n1.log_path, ["pipeline.stopped_by_shard"])
        if e.get("reason") == "reshard"
    ]
    n2_reads = [event_time(e["timestamp"]) for e in log_events(n2.log_path, ["consumer.assigned"])]
    assert n1_stopped and n2_reads
    # n1 read with its lanes, and each lane logged its consumer's assignment.
    n1_lanes = log_events(n1.log_path, ["lanes.started"])
    assert n1_lanes and all(e["lanes"] == 3 for e in n1_lanes), n1_lanes
    n1_assigned = log_events(n1.log_path, ["consumer.assigned"])
    assert {e.get("lane") for e in n1_assigned} == {0, 1, 2}, n1_assigned
    assert max(n1_stopped) < min(n2_reads)
    assert min(n2_reads) > requested
    assert not [
        e
        for e in log_events(n1.log_path, ["consumer.assigned"])
        if event_time(e["timestamp"]) > requested
    ]
