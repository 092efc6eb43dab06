"""`LeadershipWatcher`: every change of `shards/<s>/leader`, recorded from a ZooKeeper session
of its own, and `leader_violations`: whether two nodes ever led one shard at once."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from kazoo.client import KazooClient

from hakafka.coordination import paths


@dataclass(frozen=True)
class LeaderObservation:
    """One state of `shards/<shard>/leader` as seen at `at` (Unix time); node None: no leader."""

    at: float
    shard: int
    node: str | None
    epoch: int | None
    status: str | None


class LeadershipWatcher:
    """Watches the leader znode of each shard from its own session and records every change."""

    def __init__(self, hosts: str, root: str, shards: Iterable[int]) -> None:
        self._client = KazooClient(hosts=f"{hosts}{root}", timeout=10.0)
        self._shards = list(shards)
        self._lock = threading.Lock()
        self._seen: list[LeaderObservation] = []

    def start(self, timeout: float = 15.0) -> None:
        self._client.start(timeout=timeout)
        for shard in self._shards:
            self._client.DataWatch(paths.leader(shard), self._recorder(shard))

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self._client.stop()
        with contextlib.suppress(Exception):
            self._client.close()

    def _recorder(self, shard: int) -> Callable[[bytes | None, Any], None]:
        def record(data: bytes | None, _stat: Any) -> None:
            node: str | None = None
            epoch: int | None = None
            status: str | None = None
            if data:
                try:
                    value = json.loads(data)
                    node, epoch, status = value["node"], int(value["epoch"]), value.get("status")
                except (ValueError, KeyError, TypeError):
                    node, status = f"<unreadable {data[:60]!r}>", "unreadable"
            with self._lock:
                self._seen.append(LeaderObservation(time.time(), shard, node, epoch, status))

        return record

    def observations(self) -> list[LeaderObservation]:
        with self._lock:
            return list(self._seen)

    def current(self, shard: int) -> str | None:
        """The node last seen leading `shard`, or None."""
        for seen in reversed(self.observations()):
            if seen.shard == shard:
                return seen.node
        return None

    def violations(self) -> list[str]:
        """Leader changes that break "one leader per epoch, epochs only grow" per shard."""
        return leader_violations(self.observations())


def leader_violations(observations: Iterable[LeaderObservation]) -> list[str]:
    """Per shard, in observation order: an epoch never comes back with another node, and
    never goes backwards."""
    problems: list[str] = []
    last: dict[int, LeaderObservation] = {}
    for seen in observations:
        if seen.node is None or seen.epoch is None:
            continue
        before = last.get(seen.shard)
        if before is not None and before.epoch is not None:
            if seen.epoch == before.epoch and seen.node != before.node:
                problems.append(
                    f"shard {seen.shard}: epoch {seen.epoch} held by {before.node} and then "
                    f"by {seen.node} (at {seen.at:.3f})"
                )
            elif seen.epoch < before.epoch:
                problems.append(
                    f"shard {seen.shard}: epoch went back from {before.epoch} ({before.node}) "
                    f"to {seen.epoch} ({seen.node}) at {seen.at:.3f}"
                )
        last[seen.shard] = seen
    return problems
