"""One buffer name per pipeline on a node leading two shards, and `hakafka query` that fails
naming a shard without a reachable leader instead of leaving it out: `hakafka run` processes
and the `hakafka` command on the real local stack."""

from __future__ import annotations

import json
import signal
from collections import Counter
from typing import Any
from urllib.parse import quote

import pytest

from devstack.cluster import StackEndpoints
from devstack.records import create_topic, produce
from tests.commands import hakafka
from tests.helpers.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.slow]

PARTITIONS = 8
# Nothing flushes: every row stays in its leader's buffer for the whole test.
HOLD: dict[str, int | float] = {"min_rows": 1_000_000, "max_age": 300}


def rows(node: Any, sql: str) -> list[dict[str, Any]]:
    """`sql` over the node's own buffers (it leads what it answers for): JSON rows."""
    code, body = node.get(f"/query?sql={quote(sql)}&format=json", timeout=30.0)
    assert code == 200, body
    found: list[dict[str, Any]] = json.loads(body)["rows"]
    return found


def test_a_node_leading_two_shards_answers_for_both_and_query_names_a_lost_shard(
    make_cluster: Any, stack: StackEndpoints, topic_prefix: str
) -> None:
    topic = f"{topic_prefix}_events"
    create_topic(stack.kafka, topic, PARTITIONS)
    cluster = make_cluster({"n1": [0, 1], "n2": [0]}, buffer=HOLD)
    n1, n2 = cluster.nodes["n1"], cluster.nodes["n2"]
    n1.start()  # alone first: it leads both shards
    n1.wait_up()
    wait_for(lambda: n1.leads() == [0, 1], 120, "n1 to lead shards 0 and 1")
    n2.start()
    n2.wait_up()
    produced = produce(stack.kafka, topic, 4_000, partitions=PARTITIONS, bad_every=97)
    # Shard 0 owns the even partitions, shard 1 the odd ones.
    good = Counter(p % 2 for p, _ in produced.good)
    bad = Counter(p % 2 for p, _ in produced.bad)
    assert good[0] and good[1] and bad[0] and bad[1]
    wait_for(
        lambda: sum(p["buffer_rows"] for p in n1.pipelines()) == len(produced.good),
        120,
        "n1's buffers to hold every good row",
    )

    # One name per pipeline on n1: both shards' rows, told apart by `_shard`.
    per_shard = "SELECT _shard, count(*) AS n, min(_partition % 2) AS lo, max(_partition % 2) AS hi"
    assert rows(n1, f"{per_shard} FROM events GROUP BY _shard ORDER BY _shard") == [
        {"_shard": 0, "n": good[0], "lo": 0, "hi": 0},
        {"_shard": 1, "n": good[1], "lo": 1, "hi": 1},
    ]
    assert rows(n1, "SELECT count(*) AS n FROM events") == [{"n": len(produced.good)}]
    dead = "SELECT _shard, count(*) AS n FROM events_dead_letter GROUP BY 1 ORDER BY 1"
    assert rows(n1, dead) == [{"_shard": 0, "n": bad[0]}, {"_shard": 1, "n": bad[1]}]
    # `hakafka query` asks n1 once per shard, for that shard only: nothing counted twice.
    config = str(n2.config_path)
    counts = hakafka("query", "--config", config, "--json", "SELECT count(*) AS n FROM events")
    assert counts.code == 0, counts.err
    assert json.loads(counts.out) == [{"n": good[0]}, {"n": good[1]}]
    assert counts.err == ""

    # n1 stopped by its PID: n2 takes shard 0 over, shard 1 has no node left.
    n1.kill(signal.SIGKILL)
    assert cluster.wait_leaders([0], timeout=120) == {0: "n2"}
    wait_for(
        lambda: sum(p["buffer_rows"] for p in n2.pipelines()) == good[0],
        120,
        "n2 to read shard 0 again",
    )
    lost = hakafka(
        "query", "--config", config, "--json", "--wait", "1", "SELECT count(*) AS n FROM events"
    )
    assert lost.code == 1 and lost.out == ""
    assert "shard 1: it has no leader; no next leader answered within 1 s" in lost.err, lost.err
    part = hakafka(
        "query",
        "--config",
        config,
        "--json",
        "--wait",
        "1",
        "--partial",
        "SELECT count(*) AS n FROM events",
    )
    assert part.code == 0, part.err
    assert json.loads(part.out) == [{"n": good[0]}]
    assert part.err.startswith("hakafka: skipped shard 1: shard 1: it has no leader"), part.err
    only = hakafka(
        "query", "--config", config, "--json", "--shard", "0", "SELECT count(*) AS n FROM events"
    )
    assert only.code == 0, only.err
    assert json.loads(only.out) == [{"n": good[0]}]
