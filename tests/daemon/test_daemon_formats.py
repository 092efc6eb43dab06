"""Avro and Protobuf pipelines end to end: a `hakafka run` node reads Confluent-framed
records (serialized by confluent-kafka's serializers against the dev stack's registry) into
ClickHouse exactly once, across a schema change mid-stream (version 2 adds `note` with a
default) and a registry outage: the registry process is stopped by PID while records of the
new version, which the node has never seen, are produced, then started again. Bad inputs
(wrong magic byte, unknown schema id, a broken record) are dead letters with their reason;
no good record ever is."""

from __future__ import annotations

import time
from typing import Any

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient

from devstack.cluster import StackEndpoints
from devstack.records import create_topic
from devstack.schema_registry import SchemaRegistryService
from tests.commands import edit
from tests.formats import produce_values, registry, serializer_for
from tests.helpers.landing import assert_exactly_once, count, landed
from tests.helpers.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.slow]
__all__ = ["registry"]  # the fixture

SHARDS = [0, 1]
PARTITIONS = 4
PER_VERSION = 3000
BUFFER = {"min_rows": 500, "max_rows": 100_000, "min_bytes": 1, "min_age": 1, "max_age": 2}


def bad_inputs(fmt: str, good: bytes) -> dict[bytes, str]:
    """Broken variants of the good value `good` -> the reason its dead letter must give."""
    broken_body = (
        (good[:-1], "the Avro record is cut short (writer schema 1)")
        if fmt == "avro"
        else (good[:6] + b"\xff\xff\xff", "Error parsing message with type 'hakafka.test.Event'")
    )
    return {
        b"\x01" + good[1:]: "wrong magic byte 1 (expected 0): not in the Confluent wire format",
        b"\x00\x00\x00\x03\xe7"
        + good[5:]: "unknown schema id 999: the schema registry has no such schema",
        broken_body[0]: broken_body[1],
    }


@pytest.mark.parametrize("fmt", ["avro", "protobuf"])
def test_format_exactly_once_through_a_schema_change_and_a_registry_outage(
    fmt: str,
    *,
    make_cluster: Any,
    stack: StackEndpoints,
    topic_prefix: str,
    ch_client: Any,
    registry: SchemaRegistryService,
) -> None:
    topic = f"{topic_prefix}_events"
    create_topic(stack.kafka, topic, PARTITIONS)
    cluster = make_cluster({"n1": SHARDS}, buffer=BUFFER)
    node = cluster.nodes["n1"]
    edit(
        node.config_path,
        r'^on_error = "dead_letter"$',
        f'on_error = "dead_letter"\nformat = "{fmt}"',
    )
    edit(
        node.config_path,
        r'^amount = "Nullable\(Float64\)"$',
        'amount = "Nullable(Float64)"\nnote = "Nullable(String)"',
    )
    node.config_path.write_text(
        node.config_path.read_text() + f'\n[schema_registry]\nurl = "{registry.url}"\n'
    )
    client = SchemaRegistryClient({"url": registry.url})
    v1 = serializer_for(fmt, client, version=1)
    cluster.start()
    cluster.wait_leaders(SHARDS)

    # Version 1 and the bad inputs.
    first = [v1(i) for i in range(PER_VERSION)]
    bad = bad_inputs(fmt, first[0])
    placed = produce_values(stack.kafka, topic, [*first, *bad], PARTITIONS)
    good, dead = set(placed[:PER_VERSION]), set(placed[PER_VERSION:])
    wait_for(lambda: landed(ch_client, "events") >= len(good), 180, "version 1 in ClickHouse")
    wait_for(lambda: landed(ch_client, "events_dead_letter") >= len(dead), 60, "dead letters")
    reasons = ch_client.query("SELECT _error FROM events_dead_letter").result_rows
    assert len(reasons) == len(bad)
    for expected in bad.values():
        assert any(expected in r[0] for r in reasons), (expected, reasons)

    # Version 2 (registered now, id 2, never seen by the node) produced while the registry
    # is down: the node waits, says so in status, and dead-letters nothing.
    v2 = serializer_for(fmt, client, version=2)
    second = [v2(i) for i in range(PER_VERSION, 2 * PER_VERSION)]
    assert client.get_versions("events-value")[-1] == 2
    pid = registry.pid
    registry.stop()
    assert pid is not None and registry.pid is None
    good |= set(produce_values(stack.kafka, topic, second, PARTITIONS))

    def registry_error() -> str:
        return "\n".join(p["error"] for p in node.pipelines() if p["error"])

    wait_for(lambda: "schema registry" in registry_error(), 60, "status to show the outage")
    assert all(p["state"] == "consuming" for p in node.pipelines())
    time.sleep(3)  # more retries while it is away
    assert count(ch_client, "events") == PER_VERSION
    assert count(ch_client, "events_dead_letter") == len(dead)
    registry.start()

    wait_for(lambda: landed(ch_client, "events") >= len(good), 180, "version 2 in ClickHouse")
    time.sleep(3)  # one more flush cycle: nothing may arrive twice afterwards
    assert_exactly_once(ch_client, "events", good)
    assert_exactly_once(ch_client, "events_dead_letter", dead)
    assert registry_error() == ""
    notes = ch_client.query(
        "SELECT countIf(note IS NULL), countIf(note = concat('n', toString(id))), "
        "countIf(kind = ['click', 'view', 'buy'][id % 3 + 1]) FROM events"
    ).result_rows[0]
    assert notes == (PER_VERSION, PER_VERSION, 2 * PER_VERSION)
