"""The scale path at a small scale, so that it does not rot: six `hakafka run` processes
serving twenty shards (two replicas each) on the real local stack, sharing one Spark Connect
server as a fleet shares Spark. A cold start elects every shard exactly once, and a kill -9
moves every shard of the killed daemon to its other replica. No data: the election is what
is measured."""

from __future__ import annotations

import json
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from devstack.cluster import LocalCluster, StackEndpoints
from devstack.records import create_topic
from tests.commands import hakafka
from tests.helpers.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.slow]

NODES = [f"n{i}" for i in range(6)]
SHARDS = list(range(20))
SESSION_TIMEOUT = 3.0  # make_cluster's


def replicas(shard: int) -> tuple[str, str]:
    """The two nodes of `shard`: neighbours on a ring, so every node serves 6 or 7 shards."""
    return NODES[shard % len(NODES)], NODES[(shard + 1) % len(NODES)]


def epochs(config: Path) -> dict[int, int | None]:
    status = hakafka("status", "--config", str(config), "--json")
    return {s["shard"]: s["epoch"] for s in json.loads(status.out)["shards"]}


def test_a_cold_start_elects_each_shard_once_and_a_kill_moves_all_of_a_daemons_shards(
    make_cluster: Any, stack: StackEndpoints, topic_prefix: str
) -> None:
    create_topic(stack.kafka, f"{topic_prefix}_events", len(SHARDS))
    layout = {n: [s for s in SHARDS if n in replicas(s)] for n in NODES}
    # make_cluster's daemons share the session's Spark Connect server.
    cluster: LocalCluster = make_cluster(layout, shard_count=len(SHARDS))
    began = time.monotonic()
    cluster.start(timeout=120)
    leaders = cluster.wait_leaders(SHARDS, timeout=120)
    cold_start = time.monotonic() - began
    assert all(leaders[s] in replicas(s) for s in SHARDS), leaders
    config = cluster.nodes[NODES[0]].config_path
    assert epochs(config) == dict.fromkeys(SHARDS, 1)  # one election per shard, no flapping

    counts = Counter(leaders.values())
    victim, led = counts.most_common(1)[0]
    moved = sorted(s for s, n in leaders.items() if n == victim)
    cluster.nodes[victim].kill(signal.SIGKILL)
    killed = time.monotonic()
    wait_for(
        lambda: all(cluster.leaders().get(s) not in (None, victim) for s in moved),
        SESSION_TIMEOUT + 60,
        f"the {led} shards of {victim} to be led by their other replica",
        interval=0.2,
    )
    took = time.monotonic() - killed
    after = cluster.leaders()
    assert {s: after[s] for s in moved} == {
        s: next(n for n in replicas(s) if n != victim) for s in moved
    }
    assert epochs(config) == {s: 2 if s in moved else 1 for s in SHARDS}
    print(
        f"fleet: 6 daemons, 20 shards: cold start -> all consuming {cold_start:.1f} s;"
        f" kill -9 of {victim} leading {led} -> all consuming {took:.1f} s"
    )
