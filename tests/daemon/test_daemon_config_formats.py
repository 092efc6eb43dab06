"""`format = "avro" | "protobuf"`, `schema_file` and `[schema_registry]` in the config, and
what `settings` makes of them (the registry's password a secret like the others)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hakafka.config import ConfigError, parse_config
from hakafka.consumer import Format
from hakafka.consumer.avro import AvroDecoder
from hakafka.settings import decoder_of, pipeline_schema, registry_of
from tests.formats import AVRO_V1
from tests.helpers.configs import minimal


def config(pipeline: dict[str, Any], registry: dict[str, Any] | None = None) -> Any:
    events = {"name": "events", "topic": "t", "table": "events", "columns": {"id": "Int64"}}
    data = minimal(pipelines=[events | pipeline])
    if registry is not None:
        data["schema_registry"] = registry
    return parse_config(data)


def problems(pipeline: dict[str, Any], registry: dict[str, Any] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as raised:
        config(pipeline, registry)
    return raised.value.problems


def test_registry_formats_need_a_registry_url() -> None:
    for fmt in ("avro", "protobuf"):
        assert problems({"format": fmt}) == [
            f"schema_registry.url: is required: pipeline 'events' reads {fmt} from a registry"
        ]
    assert problems({"format": "protobuf"}, {"url": "registry:8081"}) == [
        "schema_registry.url: must be http(s)://host:port[/path], got 'registry:8081'"
    ]


def test_schema_file_is_for_avro_only_and_must_be_readable(tmp_path: Path) -> None:
    path = tmp_path / "event.avsc"
    path.write_text(json.dumps(AVRO_V1))
    assert problems({"format": "json", "schema_file": str(path)}) == [
        'pipelines[0].schema_file: only format = "avro" reads one'
    ]
    (found,) = problems({"format": "avro", "schema_file": str(tmp_path / "none.avsc")})
    assert found.startswith("pipelines[0].schema_file: cannot read")
    plain = config({"format": "avro", "schema_file": str(path)})
    pipeline = plain.pipelines[0]
    assert (pipeline.format, registry_of(plain)) == (Format.AVRO, None)
    assert isinstance(decoder_of(pipeline, pipeline_schema(pipeline)), AvroDecoder)


def test_registry_password_is_a_secret_from_a_file_or_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = tmp_path / "registry.password"
    secret.write_text("s3cret\n")
    registry = {"url": "https://sr.example:8081", "user": "svc", "password_file": str(secret)}
    loaded = config({"format": "avro"}, registry)
    assert "s3cret" not in repr(loaded)
    settings = registry_of(loaded)
    assert settings is not None and "s3cret" not in repr(settings)
    assert (settings.url, settings.user, settings.password) == (
        "https://sr.example:8081",
        "svc",
        "s3cret",
    )
    monkeypatch.setenv("HAKAFKA_SCHEMA_REGISTRY_PASSWORD", "from-env")
    settings = registry_of(config({"format": "avro"}, registry))
    assert settings is not None and settings.password == "from-env"
    monkeypatch.delenv("HAKAFKA_SCHEMA_REGISTRY_PASSWORD")
    assert problems({"format": "avro"}, {"url": "http://127.0.0.1:1", "user": "svc"}) == [
        "schema_registry.password: basic auth needs both user and password"
    ]
