"""The dev stack's schema registry, through confluent-kafka's real client: ids, versions,
lookups, compatibility and config, kept across a stop and start by PID."""

from __future__ import annotations

import json

import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError

from devstack.process import pid_alive
from devstack.schema_registry import SchemaRegistryService
from tests.formats import AVRO_V1, AVRO_V2, registry

__all__ = ["registry"]  # the fixture


def test_register_lookup_versions_compatibility_and_restart(
    registry: SchemaRegistryService,
) -> None:
    client = SchemaRegistryClient({"url": registry.url})
    v1, v2 = Schema(json.dumps(AVRO_V1), "AVRO"), Schema(json.dumps(AVRO_V2), "AVRO")
    first = client.register_schema("a-value", v1)
    assert client.register_schema("a-value", v1) == first  # the same schema keeps its id
    assert client.register_schema("b-value", v1) == first  # and shares it across subjects
    assert client.test_compatibility("a-value", v2)  # the added field has a default
    no_default = dict(AVRO_V2, fields=[*AVRO_V1["fields"], {"name": "x", "type": "int"}])
    assert not client.test_compatibility("a-value", Schema(json.dumps(no_default), "AVRO"))
    second = client.register_schema("a-value", v2)
    assert second != first
    assert client.get_subjects() == ["a-value", "b-value"]
    assert client.get_versions("a-value") == [1, 2]
    latest = client.get_latest_version("a-value")
    assert (latest.schema_id, latest.version) == (second, 2)
    assert client.lookup_schema("a-value", v1).version == 1
    client.set_compatibility("a-value", "FULL")
    assert client.get_compatibility("a-value") == "FULL"
    with pytest.raises(SchemaRegistryError) as missing:
        client.get_schema(99)
    assert (missing.value.http_status_code, missing.value.error_code) == (404, 40403)

    pid = registry.pid
    assert pid is not None
    registry.stop()
    assert not pid_alive(pid)
    registry.start()  # same port and state directory
    again = SchemaRegistryClient({"url": registry.url})
    assert json.loads(again.get_schema(second).schema_str or "") == AVRO_V2
    assert again.get_versions("a-value") == [1, 2]
