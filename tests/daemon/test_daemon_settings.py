"""A node whose shard-wide settings differ from the recorded ones stands in no shard, and a
leader whose settings stop agreeing with the record steps down: `hakafka run` processes on
the real local stack."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kazoo.client import KazooClient

from devstack.cluster import DaemonNode, LocalCluster, StackEndpoints
from devstack.process import wait_until
from devstack.records import create_topic
from hakafka.coordination import paths
from tests.commands import edit, hakafka
from tests.helpers.logs import events

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.slow]

SHARDS = [0, 1]


def candidates(stack: StackEndpoints, zk_root: str) -> dict[int, list[str]]:
    """The nodes standing in each shard's election (their candidate znodes)."""
    zk = KazooClient(hosts=stack.zookeeper)
    zk.start(timeout=10)
    try:
        found = {}
        for shard in SHARDS:
            names = zk.get_children(f"{zk_root}{paths.election(shard)}")
            found[shard] = sorted(
                zk.get(f"{zk_root}{paths.candidate(shard, n)}")[0].decode() for n in names
            )
        return found
    finally:
        zk.stop()
        zk.close()


def drift_of(node: DaemonNode) -> list[str]:
    """The node's settings drift, once it has compared its settings with the record (its
    `/status` says null until then)."""
    wait_until(
        lambda: node.status()["settings_drift"] is not None,
        timeout=60,
        what=f"{node.name} to compare its settings",
        interval=0.2,
    )
    drift: list[str] = node.status()["settings_drift"]
    return drift


def test_a_node_with_other_settings_stands_nowhere_and_a_changed_record_moves_the_leader(
    make_cluster: Any, stack: StackEndpoints, topic_prefix: str, zk_root: str
) -> None:
    create_topic(stack.kafka, f"{topic_prefix}_events", 4)
    cluster: LocalCluster = make_cluster({"n1": SHARDS, "n2": SHARDS, "n3": SHARDS})
    n1, n2, n3 = (cluster.nodes[n] for n in ("n1", "n2", "n3"))
    edit(n2.config_path, r'^on_error = "dead_letter"$', 'on_error = "skip"')
    edit(n3.config_path, r'^amount = "Nullable\(Float64\)"$', '\\g<0>\nnote = "Nullable(String)"')
    assert hakafka("init", "--config", str(n1.config_path)).code == 0
    cluster.start()

    # n1 has the recorded settings and leads both shards; n2 and n3 stay up, stand nowhere,
    # and say why in /status, in the log and in `hakafka status`.
    assert cluster.wait_leaders(SHARDS) == {0: "n1", 1: "n1"}
    assert candidates(stack, zk_root) == {0: ["n1"], 1: ["n1"]}
    (on_error,) = drift_of(n2)
    assert on_error.startswith(
        'pipeline "events": on_error: recorded "dead_letter", this config "skip" (incompatible'
    )
    (note,) = drift_of(n3)
    assert note == (
        'pipeline "events": columns.note: recorded (none), this config "Nullable(String)" '
        "(compatible)"
    )
    assert [s["standing"] for s in n2.status()["shards"]] == [False, False]
    assert drift_of(n1) == [] and [s["standing"] for s in n1.status()["shards"]] == [True, True]
    # One event per comparison: n2 compares again when another node adds its endpoints to
    # the record, so there may be more than one, each naming the same difference.
    logged = events(n2, "settings.drift")
    assert logged
    assert all(e["differences"] == [on_error] and e["level"] == "error" for e in logged)
    status = hakafka("status", "--config", str(n1.config_path), "--json")
    assert status.code == 0, status.err
    errors = {n["node"]: n["error"] for n in json.loads(status.out)["nodes"]}
    assert errors["n1"] is None
    assert errors["n2"] == f"settings drift: {on_error}"

    # Recording n3's compatible change makes n1 step down and n3 stand and lead; n2 still
    # differs and still stands nowhere.
    updated = hakafka("init", "--update", "--config", str(n3.config_path))
    assert updated.code == 0, updated.err
    wait_until(
        lambda: cluster.leaders() == {0: "n3", 1: "n3"},
        timeout=120,
        what="n3 to lead both shards",
        interval=0.5,
    )
    assert candidates(stack, zk_root) == {0: ["n3"], 1: ["n3"]}
    (removed,) = drift_of(n1)
    assert removed.startswith(
        'pipeline "events": columns.note: recorded "Nullable(String)", this config (none) '
        "(incompatible"
    )
    assert {e["reason"] for e in events(n1, "shard.withdrawing")} == {
        "shard-wide settings differ from the recorded ones"
    }
    assert drift_of(n3) == []
    # n2 compares again too: it still differs in on_error, and now also lacks the column.
    wait_until(lambda: len(drift_of(n2)) == 2, timeout=30, what="n2 to compare again", interval=0.5)
    assert sorted(d.split(":")[1].strip() for d in drift_of(n2)) == ["columns.note", "on_error"]
    assert all(n.alive() for n in (n1, n2, n3))
