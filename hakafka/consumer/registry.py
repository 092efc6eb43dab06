"""Writer schemas from a Confluent-compatible schema registry, and the Confluent wire format.

A message in the wire format is a magic byte 0, the writer schema's id (4 bytes, big-endian)
and the encoded record (Protobuf puts its message-index array between the two). Schemas are
fetched with confluent-kafka's own `SchemaRegistryClient`, which caches each id it found.

Two kinds of failure are kept apart, because they are handled in opposite ways:
- the registry answers that an id does not exist (HTTP 404): the message is bad (a dead
  letter naming the id), as is a wrong magic byte or a message shorter than the header;
- the registry cannot answer (down, timing out, 5xx, refusing our credentials):
  `RegistryUnavailableError`, an outage. The decoder raises it before it decides anything
  about the batch, and the pipeline waits and decodes the same batch again, so a good
  message never becomes a dead letter because the registry was away.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hakafka.consumer.errors import ConsumerError

MAGIC = 0
HEADER_BYTES = 5  # magic byte + 4-byte schema id


class RegistryUnavailableError(ConsumerError):
    """The schema registry cannot answer now; retried by the pipeline, never a bad message."""


@dataclass(frozen=True)
class RegistrySettings:
    """How to reach the registry: `url` (several comma-separated are tried in turn), basic
    auth (`user`, `password`), a CA file for TLS (`ca_file`), a request `timeout` in s."""

    url: str
    user: str = ""
    password: str = field(default="", repr=False)
    ca_file: str = ""
    timeout: float = 10.0


@dataclass(frozen=True)
class RegisteredSchema:
    """A schema as the registry holds it: its text, type and references."""

    schema_id: int
    text: str
    schema_type: str  # AVRO, PROTOBUF
    references: tuple[tuple[str, str, int], ...]  # (name, subject, version)


class SchemaRegistry:
    """Schemas by id through confluent-kafka's `SchemaRegistryClient` (cached by id there)."""

    def __init__(self, settings: RegistrySettings) -> None:
        from confluent_kafka.schema_registry import SchemaRegistryClient

        conf: dict[str, Any] = {
            "url": settings.url,
            "timeout": settings.timeout,
            # The pipeline retries with its own backoff and reports the outage meanwhile.
            "max.retries": 0,
        }
        if settings.user:
            conf["basic.auth.user.info"] = f"{settings.user}:{settings.password}"
        if settings.ca_file:
            conf["ssl.ca.location"] = settings.ca_file
        self.url = settings.url
        self._client = SchemaRegistryClient(conf)

    def by_id(self, schema_id: int, fmt: str | None = None) -> RegisteredSchema | None:
        """The schema with `schema_id`; None if the registry says there is none.
        `fmt="serialized"` asks for Protobuf schemas as base64 FileDescriptorProtos."""
        schema = self._call(f"schema id {schema_id}", self._client.get_schema, schema_id, fmt=fmt)
        return None if schema is None else _registered(schema_id, schema)

    def version(self, subject: str, version: int, fmt: str | None = None) -> RegisteredSchema:
        """Version `version` of `subject` (a Protobuf reference); a missing one is an error
        naming it (the registry lost a schema another one refers to)."""
        found = self._call(
            f"subject {subject!r} version {version}",
            self._client.get_version,
            subject,
            version,
            fmt=fmt,
        )
        if found is None:
            raise ConsumerError(f"schema registry {self.url}: {subject!r} v{version} is missing")
        return _registered(found.schema_id, found.schema)

    def _call(self, what: str, method: Any, *args: Any, **kwargs: Any) -> Any:
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        try:
            return method(*args, **kwargs)
        except SchemaRegistryError as exc:
            if exc.http_status_code == 404:
                return None
            raise RegistryUnavailableError(
                f"schema registry {self.url} failed for {what}: {exc}"
            ) from None
        except Exception as exc:  # transport errors (httpx), timeouts, TLS
            raise RegistryUnavailableError(
                f"schema registry {self.url} unreachable for {what}: {type(exc).__name__}: {exc}"
            ) from None


def _registered(schema_id: int, schema: Any) -> RegisteredSchema:
    refs = tuple((r.name, r.subject, int(r.version)) for r in (schema.references or ()))
    return RegisteredSchema(schema_id, schema.schema_str, schema.schema_type or "AVRO", refs)


def unknown_id(schema_id: int) -> str:
    """The reason a message whose schema id the registry does not know is bad."""
    return f"unknown schema id {schema_id}: the schema registry has no such schema"


def wire_headers(values: list[bytes]) -> tuple[np.ndarray, dict[int, str]]:
    """The schema id in each value's Confluent header (positions of `values`), and the values
    that have none (position -> reason). Vectorised: one join and a few numpy ops."""
    sizes = np.fromiter(map(len, values), np.int64, len(values))
    starts = np.cumsum(sizes) - sizes
    data = np.frombuffer(b"".join(values) + bytes(HEADER_BYTES), np.uint8)
    head = data[starts[:, None] + np.arange(HEADER_BYTES)].astype(np.int64)
    ids = (head[:, 1] << 24) | (head[:, 2] << 16) | (head[:, 3] << 8) | head[:, 4]
    problems: dict[int, str] = {}
    for pos in np.flatnonzero((sizes < HEADER_BYTES) | (head[:, 0] != MAGIC)):
        if sizes[pos] < HEADER_BYTES:
            problems[int(pos)] = (
                f"message of {sizes[pos]} bytes is shorter than the {HEADER_BYTES}-byte "
                "Confluent header (magic byte, schema id)"
            )
        else:
            problems[int(pos)] = (
                f"wrong magic byte {head[pos, 0]} (expected {MAGIC}): not in the Confluent "
                "wire format"
            )
    return ids, problems


def group_by_id(ids: np.ndarray, positions: list[int]) -> dict[int, list[int]]:
    """`positions` grouped by their schema id, each group in its original order."""
    chosen = ids[positions]
    groups: dict[int, list[int]] = {}
    for schema_id in np.unique(chosen):
        groups[int(schema_id)] = [positions[i] for i in np.flatnonzero(chosen == schema_id)]
    return groups
