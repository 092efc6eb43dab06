"""Missing inputs are named: a daemon whose topic does not exist (a typo, or not created yet)
says so in `/status`, `hakafka status`, `hakafka_pipeline_state`, and past `stuck_after` in
`/ready` (503 with the reason); once the topic exists, its rows land and it is ready again."""

from __future__ import annotations

from typing import Any

import pytest

from devstack.cluster import StackEndpoints
from devstack.records import create_topic, produce
from tests import commands
from tests.helpers.landing import landed
from tests.helpers.metrics import samples
from tests.helpers.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.slow]


def test_a_missing_topic_is_named_and_not_ready_past_the_bound(
    make_cluster: Any, stack: StackEndpoints, topic_prefix: str, ch_client: Any
) -> None:
    topic = f"{topic_prefix}_events"  # not created: the config names a topic that is not there
    cluster = make_cluster({"n1": [0, 1]}, server={"stuck_after": 4})
    node = cluster.nodes["n1"]
    node.start()
    node.wait_up()
    cluster.wait_leaders([0, 1])

    def waits() -> list[str]:
        return [w["state"] for p in node.pipelines() for w in p["waiting"]]

    wait_for(lambda: waits() == ["waiting_for_topic"] * 2, 60, "both shards waiting for the topic")
    (wait,) = node.pipelines()[0]["waiting"]
    assert wait["detail"] == f"topic {topic} does not exist"

    # Each shard's pipeline passes the bound on its own clock: 503 comes with the first.
    def not_ready_for_both() -> bool:
        code, text = node.get("/ready")
        return code == 503 and all(
            f"not ready: shard {s} pipeline events: no progress for " in text.decode()
            for s in (0, 1)
        )

    wait_for(not_ready_for_both, 30, "both shards not ready past stuck_after")
    body = node.get("/ready")[1].decode()
    assert "waiting_for_topic for " in body and f"topic {topic} does not exist" in body, body
    states = samples(node, "hakafka_pipeline_state")
    assert states == {
        f'{{pipeline="events",shard="{s}",state="waiting_for_topic"}}': 1.0 for s in (0, 1)
    }, states
    status = commands.hakafka("status", "--config", str(node.config_path))
    assert status.code == 1, status
    assert "waiting_for_topic for " in status.out and f"topic {topic} does not exist" in (
        status.out
    ), status.out

    create_topic(stack.kafka, topic, 4)
    produce(stack.kafka, topic, 200, partitions=4)
    wait_for(lambda: landed(ch_client, "events") == 200, 120, "the rows in ClickHouse")
    wait_for(lambda: node.get("/ready")[0] == 200, 30, "ready again")
    assert waits() == []
