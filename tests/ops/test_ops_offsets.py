"""`hakafka pipeline pause|resume`, `offsets show|set` and `pending show|drop` against `hakafka
run` processes on the real local stack: what lands in ClickHouse, offset by offset."""

from __future__ import annotations

import json
import re
import threading
from collections import Counter
from typing import Any

import pytest
from confluent_kafka import ConsumerGroupTopicPartitions
from confluent_kafka.admin import AdminClient

from devstack.cluster import LocalCluster
from devstack.process import wait_until
from devstack.records import Produced, create_topic, produce
from tests.commands import Run, hakafka

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.slow]

PARTITIONS = 4  # shard 0 owns 0 and 2, shard 1 owns 1 and 3
SHARD0 = (0, 2)
# A row with id >= POISON fails its block's flush in Spark, every time: a block in doubt
# that no retry can land, for `pending drop`.
POISON = 900_000
TRANSFORM = f"SELECT * FROM block WHERE assert_true(id < {POISON}, 'poison row') IS NULL"


def offsets_in(client: Any) -> Counter[tuple[int, int]]:
    """How many times each (partition, offset) is in the `events` table."""
    rows = client.query("SELECT _partition, _offset FROM events").result_rows
    return Counter((int(p), int(o)) for p, o in rows)


def group_offsets(bootstrap: str, group: str, topic: str) -> dict[int, int]:
    """What the Kafka consumer group `group` has committed for `topic`, by partition (other
    tests' pipelines named `events` commit other topics to the same group)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    (future,) = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)]).values()
    committed = future.result(timeout=15).topic_partitions
    return {tp.partition: tp.offset for tp in committed if tp.topic == topic}


def run(*args: str) -> Run:
    done = hakafka(*args, timeout=180)
    assert done.code == 0, f"hakafka {' '.join(args)}: exit {done.code}\n{done.err}\n{done.out}"
    return done


def test_pause_failover_offsets_and_pending_drop_under_load(
    make_cluster: Any, stack: Any, topic_prefix: str, ch_client: Any
) -> None:
    topic = f"{topic_prefix}_events"
    create_topic(stack.kafka, topic, PARTITIONS)
    cluster: LocalCluster = make_cluster(
        {"n1": [0, 1], "n2": [0, 1]},
        buffer={"min_rows": 1, "max_rows": 100_000, "min_bytes": 1, "min_age": 0.2, "max_age": 1},
        transform=TRANSFORM,
    )
    config = str(cluster.nodes["n1"].config_path)
    run("init", "--config", config)
    cluster.start()
    cluster.wait_leaders([0, 1])
    produced = produce(stack.kafka, topic, 4000, partitions=PARTITIONS)
    wait_until(
        lambda: set(offsets_in(ch_client)) == produced.good,
        timeout=120,
        what="the first 4000 rows in ClickHouse",
    )
    # Each checkpoint is mirrored to the consumer group hakafka.events (for Kafka's tools).
    wait_until(
        lambda: (
            group_offsets(stack.kafka, "hakafka.events", topic) == dict.fromkeys(range(4), 1000)
        ),
        timeout=30,
        what="the checkpoints in the consumer group",
    )

    # Paused, shard 0 stops; shard 1 goes on. A failover does not resume it.
    paused = run("pipeline", "pause", "--config", config, "--pipeline", "events", "--shard", "0")
    assert "shard 0, pipeline events: paused, stopped by n" in paused.out
    more = produce(stack.kafka, topic, 2000, partitions=PARTITIONS, start=4000)
    shard1 = {(p, o) for p, o in more.good if p not in SHARD0}
    wait_until(lambda: shard1 <= set(offsets_in(ch_client)), timeout=60, what="shard 1 to go on")
    run("failover", "--config", config, "--shard", "0")
    shown = json.loads(run("offsets", "show", "--config", config, "--shard", "0", "--json").out)
    assert [(r["partition"], r["checkpoint"], r["high"], r["lag"], r["paused"]) for r in shown] == [
        (0, 1000, 1500, 500, True),
        (2, 1000, 1500, 500, True),
    ]
    status = json.loads(hakafka("status", "--config", config, "--json").out)
    assert {(p["shard"], p["state"]) for p in status["pipelines"]} == {
        (0, "paused"),
        (1, "consuming"),
    }
    assert all(o < 1000 for p, o in offsets_in(ch_client) if p in SHARD0)

    # Moved to the latest offsets while a producer writes: nothing between the old checkpoint
    # and the new offsets lands, everything from the new offsets lands exactly once.
    load = Produced()

    def produce_load() -> None:
        for chunk in range(6):
            load.__ior__(
                produce(stack.kafka, topic, 500, partitions=PARTITIONS, start=6000 + chunk * 500)
            )

    # A dry run prints what the move would skip, and changes nothing.
    dry = run(
        "offsets", "set", "--config", config, "--shard", "0", "--pipeline", "events",
        "--to-latest", "--dry-run",
    )  # fmt: skip
    assert f"checkpoint of {topic} would move" in dry.out
    for partition in SHARD0:
        effect = rf"^\s+{partition}\s+1000\s+1500\s+skips 500 offsets \(1000\.\.1499\)$"
        assert re.search(effect, dry.out, re.M), dry.out
    assert dry.out.rstrip().endswith("dry run: nothing paused or changed")
    still = json.loads(run("offsets", "show", "--config", config, "--shard", "0", "--json").out)
    assert still == shown

    producer = threading.Thread(target=produce_load, name="load")
    producer.start()
    moved = run(
        "offsets",
        "set",
        "--config",
        config,
        "--shard",
        "0",
        "--pipeline",
        "events",
        "--to-latest",
    )
    assert "checkpoint of " + topic + " moved" in moved.out
    after = parse_move(moved.out)
    assert {p: before for p, (before, _after) in after.items()} == {0: 1000, 2: 1000}
    assert all(new >= 1500 for _before, new in after.values())
    run("pipeline", "resume", "--config", config, "--pipeline", "events", "--shard", "0")
    producer.join(timeout=120)
    assert not producer.is_alive()
    everything = produced.good | more.good | load.good
    expected = {(p, o) for p, o in everything if p not in SHARD0 or o < 1000 or o >= after[p][1]}
    wait_until(
        lambda: set(offsets_in(ch_client)) == expected,
        timeout=120,
        what="every row from the new offsets on",
    )
    assert max(offsets_in(ch_client).values()) == 1

    # Moved back on a running pipeline (the command pauses and resumes it): each offset from
    # the new position is consumed once more.
    high0 = max(o for p, o in everything if p == 0) + 1
    run(
        "offsets",
        "set",
        "--config",
        config,
        "--shard",
        "0",
        "--pipeline",
        "events",
        "--to-offset",
        "0:500",
    )
    wanted = Counter(expected)
    wanted.update((0, o) for o in range(500, high0))
    wait_until(
        lambda: offsets_in(ch_client) == wanted, timeout=120, what="partition 0 from offset 500"
    )

    # A block no flush can land is in doubt for good; dropping it skips its offsets.
    poison = produce(stack.kafka, topic, 1, partitions=PARTITIONS, start=POISON)
    ((partition, offset),) = poison.good
    shard = 0 if partition in SHARD0 else 1
    wait_until(
        lambda: pending_blocks(config, shard) != [],
        timeout=60,
        what="the poison block to be pending",
    )
    (block,) = pending_blocks(config, shard)
    span = block["ranges"][topic][str(partition)]
    assert span[0] <= offset < span[1]
    dry_drop = run(
        "pending", "drop", "--config", config, "--shard", str(shard), "--pipeline", "events",
        "--dry-run",
    )  # fmt: skip
    assert f"would abandon block {block['block_id']}: " in dry_drop.out
    assert pending_blocks(config, shard) == [block]
    dropped = run(
        "pending",
        "drop",
        "--config",
        config,
        "--shard",
        str(shard),
        "--pipeline",
        "events",
        "--wait",
        "90",
    )
    assert f"abandoned block {block['block_id']}: " in dropped.out
    after_drop = produce(stack.kafka, topic, 400, partitions=PARTITIONS, start=20_000)
    wait_until(
        lambda: after_drop.good <= set(offsets_in(ch_client)),
        timeout=120,
        what="rows after the dropped block",
    )
    landed = offsets_in(ch_client)
    assert (partition, offset) not in landed
    assert max(landed[k] for k in after_drop.good) == 1
    assert pending_blocks(config, shard) == []


def pending_blocks(config: str, shard: int) -> list[dict[str, Any]]:
    shown = run("pending", "show", "--config", config, "--shard", str(shard), "--json")
    found: list[dict[str, Any]] = json.loads(shown.out)
    return found


def parse_move(text: str) -> dict[int, tuple[int, int]]:
    """partition -> (before, after) from the table `offsets set` prints."""
    found = {}
    for line in text.splitlines():
        cells = line.split()[:3]
        if len(cells) == 3 and all(c.isdigit() for c in cells):
            found[int(cells[0])] = (int(cells[1]), int(cells[2]))
    return found
