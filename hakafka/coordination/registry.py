"""The node registry (`nodes/<node>`, ephemeral) and replacement flags (`replacing/<node>`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import TypeVar

import structlog
from kazoo.client import KazooState
from kazoo.exceptions import NodeExistsError
from kazoo.protocol.states import ZnodeStat

from hakafka.coordination import paths
from hakafka.coordination.errors import CorruptZnodeError, NodeIdTakenError
from hakafka.coordination.records import NodeInfo, ReplacingInfo
from hakafka.coordination.session import Watch, ZkSession

log = structlog.get_logger("hakafka.coordination")
R = TypeVar("R")


class Registry:
    """Reads and writes `nodes/` and `replacing/` through one session."""

    def __init__(self, session: ZkSession) -> None:
        self._session = session

    def register(self, node_id: str, endpoints: NodeInfo) -> None:
        """Publish `nodes/<node_id>` as an ephemeral of this session; calling it again in the
        same session is a no-op.

        A znode of another session is waited for, up to the session timeout plus the request
        timeout since this session last (re)connected: the session of a process restarted
        before ZooKeeper expired it ends within that. The wait starts again at every
        reconnection, because the ensemble electing a new leader (which drops every client's
        connection) gives every session a fresh timeout, the dead one's too. One still there
        is a live daemon with the same node id, and NodeIdTakenError says which (pid, host,
        start); it is never taken over.
        """
        path = paths.node(node_id)
        config = self._session.config
        expiry_s = config.session_timeout_s + config.request_timeout_s
        changed = threading.Event()
        connected_at = [time.monotonic()]

        def on_state(state: KazooState) -> None:
            if state == KazooState.CONNECTED:
                connected_at[0] = time.monotonic()
                changed.set()

        self._session.add_listener(on_state)
        try:
            self._session.ensure(paths.NODES)
            waited = False
            while True:
                try:
                    self._session.create(path, endpoints.encode(), ephemeral=True)
                    log.info("registry.registered", node=node_id)
                    return
                except NodeExistsError:
                    pass
                changed.clear()  # an earlier watch firing late only costs one more look
                found = self._session.exists(path, lambda _event: changed.set())
                if found is None:
                    continue
                if found.ephemeralOwner == self._session.session_id:
                    return
                left = connected_at[0] + expiry_s - time.monotonic()
                if left <= 0:
                    raise NodeIdTakenError(self._held(node_id, found, expiry_s))
                if not waited:
                    waited = True
                    log.info(
                        "registry.waiting_for_previous_session",
                        node=node_id,
                        owner=f"0x{found.ephemeralOwner:x}",
                        wait_s=round(left, 1),
                    )
                changed.wait(left)
        finally:
            self._session.remove_listener(on_state)

    def _held(self, node_id: str, found: ZnodeStat, waited_s: float) -> str:
        """Why `nodes/<node_id>` (of another session, `found`) is refused, and what to do."""
        path = paths.node(node_id)
        got = self._session.get(path)
        holder = "(its record is gone or unreadable)"
        if got is not None:
            try:
                info = NodeInfo.decode(path, got[0])
                at = datetime.fromtimestamp(info.started, UTC).isoformat(timespec="seconds")
                holder = f"registered by pid {info.pid} on host {info.host} at {at}"
            except CorruptZnodeError:
                pass
        return (
            f"node id {node_id} is held by another live session ({holder}; ZooKeeper session "
            f"0x{found.ephemeralOwner:x}, still there after {waited_s:.0f} s). Two daemons "
            "with one node id would stand in the same elections as one node; stop the other "
            "daemon, or give this one its own `node` in its config"
        )

    def nodes(self) -> dict[str, NodeInfo]:
        """Every registered (running) node and its endpoints."""
        return self._read_all(paths.NODES, NodeInfo.decode)

    def registered_since(self) -> dict[str, float]:
        """Every registered node and the Unix time its `nodes/<node>` znode was created (a
        new session registers anew)."""
        found: dict[str, float] = {}
        for name in self._session.children(paths.NODES):
            stat = self._session.exists(paths.node(name))
            if stat is not None:
                found[name] = stat.ctime / 1000
        return found

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
            path = paths.child(parent, name)
            got = self._session.get(path)
            if got is not None:
                found[name] = decode(path, got[0])
        return found

    def replacing_names(self, watch: Watch | None = None) -> set[str]:
        """The names of nodes under replacement; `watch` fires when the set changes."""
        return set(self._session.children(paths.REPLACING, watch))

    def writable_replicas(self, replicas: Mapping[str, str]) -> dict[str, str]:
        """`replicas` (node -> ClickHouse endpoint) minus the nodes flagged in `replacing/`
        right now (read on every call, never cached, after a `sync`: another session's flag
        may not have reached the member this one reads from)."""
        self._session.sync(paths.REPLACING)
        excluded = self.replacing_names()
        return {node: ep for node, ep in replicas.items() if node not in excluded}
