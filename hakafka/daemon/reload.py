"""What a config re-read (SIGHUP, `systemctl reload`) may change in a running daemon.

`plan_reload(running, read)` compares the two configs key by key. Keys that a running daemon
applies at once are `LIVE`: each pipeline's `[buffer]` thresholds and limit, the `[server]`
token, `stuck_after` and the per-request and per-query bounds it reads on every request, and
`log_level`. Any other difference is refused, naming the key and why (a restart, or for
shard-wide settings `hakafka init --update`); the refused keys keep their running values
while the live ones change. Values are never reported: a key may hold a secret.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from hakafka.config import Config, PipelineConfig

# [server] keys read per request or per query (the connection and query caps size semaphores
# and DuckDB's memory, threads and spill directory are set when it starts: a restart).
LIVE_SERVER = frozenset(
    {
        "token",
        "stuck_after",
        "max_request_bytes",
        "request_timeout",
        "query_timeout",
        "max_result_rows",
        "max_result_bytes",
    }
)
RESTART = "needs a restart"
SHARD_WIDE = "shard-wide: roll it out with `hakafka init --update` (or --replace), not a reload"
# Pipeline keys recorded in ZooKeeper's shard-wide settings (`hakafka/drift.py`).
_SHARD_WIDE_PIPELINE = frozenset(
    {"topic", "table", "columns", "meta_columns", "format", "on_error", "max_message_bytes"}
    | {"transform", "partitions"}
)


@dataclass(frozen=True)
class Refusal:
    """A key whose new value the running daemon does not take, and why."""

    key: str
    reason: str


@dataclass(frozen=True)
class ReloadPlan:
    """`config`: the running config with every live change applied; `applied`: those keys;
    `refused`: the others."""

    config: Config
    applied: tuple[str, ...]
    refused: tuple[Refusal, ...]


def _differences(key: str, old: Any, new: Any) -> Iterator[str]:
    """The dotted keys under `key` whose values differ."""
    if dataclasses.is_dataclass(old) and type(old) is type(new) and not _is_leaf(old):
        for f in dataclasses.fields(old):
            yield from _differences(f"{key}.{f.name}", getattr(old, f.name), getattr(new, f.name))
    elif isinstance(old, Mapping) and isinstance(new, Mapping) and not key.endswith("partitions"):
        for name in sorted(set(old) | set(new), key=str):
            if name not in old or name not in new:
                yield f"{key}.{name}"
            else:
                yield from _differences(f"{key}.{name}", old[name], new[name])
    elif old != new:
        yield key


def _is_leaf(value: Any) -> bool:
    # Endpoints and secrets compare whole: host:port, or a secret's value.
    return type(value).__name__ in ("Endpoint", "Secret")


def _pipeline_refusals(running: Config, read: Config) -> Iterator[Refusal]:
    old = {p.name: p for p in running.pipelines}
    new = {p.name: p for p in read.pipelines}
    for name in sorted(set(old) ^ set(new)):
        verb = "added" if name in new else "removed"
        yield Refusal(f"pipelines.{name}", f"pipeline {verb}: {SHARD_WIDE}")
    for name in sorted(set(old) & set(new)):
        for f in dataclasses.fields(PipelineConfig):
            if f.name == "buffer":
                continue
            for key in _differences(
                f"pipelines.{name}.{f.name}", getattr(old[name], f.name), getattr(new[name], f.name)
            ):
                yield Refusal(key, SHARD_WIDE if f.name in _SHARD_WIDE_PIPELINE else RESTART)


def plan_reload(running: Config, read: Config) -> ReloadPlan:
    """Which differences between the `running` config and the one just `read` apply live."""
    refused = list(_pipeline_refusals(running, read))
    applied: list[str] = []
    for f in dataclasses.fields(Config):
        if f.name in ("pipelines", "source"):
            continue
        for key in _differences(f.name, getattr(running, f.name), getattr(read, f.name)):
            field_name = key.split(".")[1] if key.startswith("server.") else ""
            if key == "log_level" or field_name in LIVE_SERVER:
                applied.append(key)
            else:
                reason = SHARD_WIDE if key in ("shard_count", "clickhouse.engine") else RESTART
                refused.append(Refusal(key, reason))
    server = dataclasses.replace(
        running.server,
        **{name: getattr(read.server, name) for name in LIVE_SERVER},
    )
    new_buffers = {p.name: p.buffer for p in read.pipelines}
    pipelines = []
    for p in running.pipelines:
        buffer = new_buffers.get(p.name, p.buffer)
        applied += [f"pipelines.{p.name}.{k}" for k in _differences("buffer", p.buffer, buffer)]
        pipelines.append(dataclasses.replace(p, buffer=buffer))
    config = dataclasses.replace(
        running, server=server, pipelines=tuple(pipelines), log_level=read.log_level
    )
    return ReloadPlan(config, tuple(applied), tuple(refused))
