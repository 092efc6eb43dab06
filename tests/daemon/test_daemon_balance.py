"""Leadership balance: `hakafka run` processes on the real local stack. Two daemons serving
the same four shards, started one after the other, end up leading two each, again after one
of them restarts, and around a shard ops hold on one node; the moves are graceful
hand-overs, and every row lands once."""

from __future__ import annotations

import json
from typing import Any

import pytest

from devstack.cluster import LocalCluster, StackEndpoints
from devstack.records import Load, create_topic, tally
from tests.commands import hakafka
from tests.helpers.landing import assert_exactly_once
from tests.helpers.logs import events
from tests.helpers.metrics import metric
from tests.helpers.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.slow]

PARTITIONS = 8
SHARDS = [0, 1, 2, 3]
# Quick looks, and a node counts as settled after 3 s: the test sees every move in seconds.
BALANCE = {"interval": 1.0, "settle": 3.0}


def spread(cluster: LocalCluster) -> list[int]:
    """How many shards each node leads, consuming, lowest first."""
    return sorted(len(node.leads()) for node in cluster.nodes.values())


def test_two_daemons_serving_four_shards_lead_two_each_after_a_start_and_a_restart(
    make_cluster: Any, stack: StackEndpoints, topic_prefix: str, ch_client: Any
) -> None:
    topic = f"{topic_prefix}_events"
    create_topic(stack.kafka, topic, PARTITIONS)
    cluster: LocalCluster = make_cluster(
        {"a": SHARDS, "b": SHARDS}, shard_count=len(SHARDS), balance=BALANCE
    )
    a, b = cluster.nodes["a"], cluster.nodes["b"]
    a.start()
    a.wait_up()
    wait_for(lambda: a.leads() == SHARDS, 120, "a, alone, to lead every shard")
    load = Load(stack.kafka, topic, PARTITIONS)
    load.start()
    try:
        b.start()
        b.wait_up()
        wait_for(lambda: spread(cluster) == [2, 2], 120, "two shards each after b started")
        # a handed two shards over, through the failover path: b moved nothing.
        assert metric(a, "hakafka_balance_moves_total") == 2
        assert metric(b, "hakafka_balance_moves_total") == 0
        moves = events(a, "balance.move")
        assert [m["to"] for m in moves] == ["b", "b"]
        assert moves[0]["why"] == "a leads 4 shards (share 2), b leads 0"
        assert len(events(a, "leader.handed_over")) == 2

        status = hakafka("status", "--config", str(a.config_path), "--json")
        nodes = {n["node"]: n["leads"] for n in json.loads(status.out)["nodes"]}
        assert nodes == {"a": 2, "b": 2}, status.out + status.err

        b.stop()  # SIGTERM: b hands its shards to a, the only node left
        wait_for(lambda: a.leads() == SHARDS, 60, "a to lead every shard while b is away")
        b.start()
        b.wait_up()
        wait_for(lambda: spread(cluster) == [2, 2], 120, "two shards each after b restarted")
        assert metric(a, "hakafka_balance_moves_total") == 4

        # Ops hold one of a's shards on b: b then leads three, and hands one of the others
        # (never the held one) back to a.
        config = str(a.config_path)
        refused = hakafka("failover", "--config", config, "--shard", "0", "--hold", "60")
        assert refused.code == 1
        assert "--hold needs --to" in refused.err
        held = a.leads()[0]
        moved = hakafka(
            "failover", "--config", config, "--shard", str(held), "--to", "b", "--hold", "600"
        )
        assert moved.code == 0, moved.out + moved.err
        assert f"shard {held}: b leads" in moved.out
        assert "held there until" in moved.out
        wait_for(
            lambda: metric(b, "hakafka_balance_moves_total") == 1 and spread(cluster) == [2, 2],
            120,
            "b to hand one shard it was not held on back to a",
        )
        assert held in b.leads()
        status = json.loads(hakafka("status", "--config", config, "--json").out)
        assert {s["shard"]: (s["held"] or {}).get("node") for s in status["shards"]} == {
            shard: "b" if shard == held else None for shard in SHARDS
        }
    finally:
        load.stop()
    produced = load.produced.good
    wait_for(
        lambda: tally(ch_client, "events", produced).missing == 0,
        120,
        "every produced record in ClickHouse",
    )
    assert_exactly_once(ch_client, "events", produced)
