"""The node registry (`nodes/<node>`, ephemeral) and replacement flags (`replacing/<node>`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TypeVar

import structlog
from kazoo.exceptions import NodeExistsError

from hakafka.coordination import paths
from hakafka.coordination.records import NodeInfo, ReplacingInfo
from hakafka.coordination.session import Watch, ZkSession

log = structlog.get_logger("hakafka.coordination")
R = TypeVar("R")


class Registry:
    """Reads and writes `nodes/` and `replacing/` through one session."""

    def __init__(self, session: ZkSession) -> None:
        self._session = session

    def register(self, node_id: str, endpoints: NodeInfo) -> None:
        """Publish `nodes/<node_id>` as an ephemeral of this session.

        A leftover znode of an earlier session of the same node (a restart before the old
        session expired) is replaced; calling this again in the same session is a no-op.
        """
        path = paths.node(node_id)
        self._session.ensure(paths.NODES)
        for _ in range(3):
            try:
                self._session.create(path, endpoints.encode(), ephemeral=True)
                log.info("registry.registered", node=node_id)
                return
            except NodeExistsError:
                found = self._session.exists(path)
                if found is None:
                    continue
                if found.ephemeralOwner == self._session.session_id:
                    return
                log.warning("registry.replaced_stale", node=node_id, owner=found.ephemeralOwner)
                self._session.delete(path, found.version)
        raise NodeExistsError(f"{path}: re-created by another session while registering")

    def nodes(self) -> dict[str, NodeInfo]:
        """Every registered (running) node and its endpoints."""
        return self._read_all(paths.NODES, NodeInfo.decode)

    def mark_replacing(self, node_id: str, reason: str, by: str) -> ReplacingInfo:
        """Flag `node_id` as under replacement (replaces an earlier flag's reason)."""
        info = ReplacingInfo(since=time.time(), by=by, reason=reason)
        path = paths.replacing(node_id)
        self._session.ensure(paths.REPLACING)
        try:
            self._session.create(path, info.encode())
        except NodeExistsError:
            self._session.set(path, info.encode())
        log.info("registry.marked_replacing", node=node_id, by=by, reason=reason)
        return info

    def clear_replacing(self, node_id: str) -> bool:
        """Remove the flag; False if `node_id` was not flagged."""
        cleared = self._session.delete(paths.replacing(node_id))
        log.info("registry.cleared_replacing", node=node_id, was_flagged=cleared)
        return cleared

    def replacing(self) -> dict[str, ReplacingInfo]:
        """Every node under replacement, with why and since when."""
        return self._read_all(paths.REPLACING, ReplacingInfo.decode)

    def _read_all(self, parent: str, decode: Callable[[str, bytes], R]) -> dict[str, R]:
        """Every child of `parent` decoded (children deleted meanwhile are left out)."""
        found: dict[str, R] = {}
        for name in self._session.children(parent):
            path = f"{parent}/{name}"
            got = self._session.get(path)
            if got is not None:
                found[name] = decode(path, got[0])
        return found

    def replacing_names(self, watch: Watch | None = None) -> set[str]:
        """The names of nodes under replacement; `watch` fires when the set changes."""
        return set(self._session.children(paths.REPLACING, watch))

    def writable_replicas(self, replicas: Mapping[str, str]) -> dict[str, str]:
        """`replicas` (node -> ClickHouse endpoint) minus the nodes flagged in `replacing/`
        right now (read on every call, never cached)."""
        excluded = self.replacing_names()
        return {node: ep for node, ep in replicas.items() if node not in excluded}
