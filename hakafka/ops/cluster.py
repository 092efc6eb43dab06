"""What every cluster-facing command shares: a ZooKeeper client built from the node's config,
reads of a node's admin endpoint, plain-text tables and the errors that map to exit codes."""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from buffer.auth import bearer_header
from buffer.client import open_url
from buffer.tls import ClientTls
from hakafka import __version__
from hakafka.config import Config
from hakafka.coordination import Coordinator, LeaderInfo, NodeInfo
from hakafka.settings import zk_config


class OpsError(RuntimeError):
    """The operation failed, was refused or timed out (exit code 1); the text says why."""


class UsageError(ValueError):
    """The command line names something the config does not have (exit code 2)."""


@contextlib.contextmanager
def connect(config: Config) -> Iterator[Coordinator]:
    """A ZooKeeper client for `config`'s cluster that reads and requests, never registers."""
    coordinator = Coordinator(
        zk_config(config),
        config.node,
        NodeInfo(
            host=socket.gethostname(), http="", flight="", pid=os.getpid(), version=__version__
        ),
    )
    coordinator.start()
    try:
        yield coordinator
    finally:
        coordinator.close()


@contextlib.contextmanager
def clickhouse_errors(where: str) -> Iterator[None]:
    """ClickHouse's client errors (connection refused, timeouts, server exceptions) raised in
    the block as one-line OpsErrors that start with `where` (`clickhouse n1 (host:8123)`)."""
    from clickhouse_connect.driver.exceptions import ClickHouseError

    try:
        yield
    except (ClickHouseError, OSError) as exc:
        text = " ".join(str(exc).split())
        raise OpsError(f"{where}: {_cause(text)}") from exc


def _cause(text: str) -> str:
    """The part of a clickhouse-connect error that says what happened: its HTTP client wraps
    a refused connection in a paragraph that ends with the cause."""
    for marker in ("Connection refused", "timed out", "Name or service not known"):
        if marker in text:
            return f"cannot connect: {marker}"
    return text[:400]


def operator() -> str:
    """Who asks, as recorded in ZooKeeper requests: `user@host`."""
    return f"{getpass.getuser()}@{socket.gethostname()}"


def check_shard(config: Config, shard: int) -> int:
    if not 0 <= shard < config.shard_count:
        raise UsageError(
            f"--shard {shard}: the cluster has shards 0..{config.shard_count - 1} "
            f"(shard_count = {config.shard_count})"
        )
    return shard


Diagnosis = Callable[[int, str], str | None]
"""Why node (2nd argument) leads shard (1st) without consuming, as the node says; None if
it does not say."""


def wait_consuming_leader(
    coordinator: Coordinator,
    shard: int,
    previous: str,
    deadline: float,
    diagnose: Diagnosis | None = None,
) -> LeaderInfo:
    """The leader of `shard` once a node other than `previous` leads it with every pipeline
    consuming; OpsError when that has not happened by `deadline` (time.monotonic()). When
    another node leads but does not consume, the error says so, with `diagnose`'s why."""
    seen: LeaderInfo | None = None  # the last other node that led without consuming
    while True:
        info = coordinator.leader_of(shard)
        if info is not None and info.node != previous:
            if info.status == "consuming":
                return info
            seen = info
        if time.monotonic() >= deadline:
            break
        time.sleep(0.1)
    if seen is not None and (info is None or info.node == previous):
        raise OpsError(
            f"shard {shard}: {seen.node} led it (epoch {seen.epoch}) without consuming and "
            f"lost or handed it back (now: {'no leader' if info is None else info.node}); "
            f"see {seen.node}'s log (`leader.handed_over`, `pipeline.failed`)"
        )
    if info is not None and info.node != previous:
        why = diagnose(shard, info.node) if diagnose is not None else None
        raise OpsError(
            f"shard {shard}: {info.node} leads it (epoch {info.epoch}) but does not consume "
            f"yet (its status: {info.status})"
            + (f": {why}" if why else "")
            + f"; check `hakafka status` and {info.node}'s log"
        )
    now = "no leader" if info is None else f"{info.node} still leads"
    raise OpsError(
        f"shard {shard}: no other node than {previous} leads and consumes yet "
        f"(now: {now}); check `hakafka status` and the logs of the candidates"
    )


def fetch_json(
    base_url: str, path: str, token: str | None, tls: ClientTls | None, timeout_s: float = 5.0
) -> Any:
    """GET `path` from a node's admin endpoint as JSON (`buffer.client.open_url`: TLS per
    `tls`, no redirect followed); OpsError naming the URL on failure."""
    request = urllib.request.Request(base_url.rstrip("/") + path)
    if token:
        request.add_header("Authorization", bearer_header(token))
    try:
        with open_url(request, tls, timeout_s) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        raise OpsError(f"{request.full_url}: HTTP {exc.code} {exc.reason}") from None
    except (OSError, ValueError) as exc:
        raise OpsError(f"{request.full_url}: {exc}") from None


def format_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Left-aligned columns separated by two spaces, one header line."""
    cells = [[str(h) for h in headers], *[["-" if v is None else str(v) for v in r] for r in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in cells
    )


def _utc_seconds(timestamp: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(timestamp))


def until(timestamp: float) -> str:
    """`2024-05-01 12:00:00Z (in 35s)` (`(35s ago)` once past)."""
    left = timestamp - time.time()
    when = f"in {left:.0f}s" if left >= 0 else f"{-left:.0f}s ago"
    return f"{_utc_seconds(timestamp)} ({when})"


def clock(timestamp: float | None) -> str | None:
    """`2024-05-01 12:00:00Z (35s ago)`, or None."""
    if timestamp is None:
        return None
    ago = max(0.0, time.time() - timestamp)
    return f"{_utc_seconds(timestamp)} ({ago:.0f}s ago)"
