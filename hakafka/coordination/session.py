"""One ZooKeeper session: KazooClient construction from `ZkConfig` (hosts, root as chroot,
session timeout, digest auth and ACLs) and ZooKeeper calls that never block forever.

Every call waits at most `request_timeout_s` and raises `ZooKeeperUnavailableError` otherwise, or
when the connection dropped while the call was in flight.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import structlog
from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (
    ConnectionClosedError,
    ConnectionLoss,
    NoNodeError,
    SessionExpiredError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import ZnodeStat
from kazoo.retry import KazooRetry
from kazoo.security import ACL, OPEN_ACL_UNSAFE, make_digest_acl

from hakafka.coordination.errors import ZooKeeperUnavailableError

log = structlog.get_logger("hakafka.coordination")

Watch = Callable[[Any], None]


@dataclass(frozen=True)
class ZkConfig:
    """How to reach ZooKeeper.

    `hosts` is a connect string (`h1:2181,h2:2181`); `root` is the chroot every path lives
    under (created on start if missing). With `auth` (user, password) the session
    authenticates with digest auth and every znode it creates is readable and writable only
    by that user.
    """

    hosts: str
    root: str = "/hakafka/default"
    session_timeout_s: float = 6.0
    connect_timeout_s: float = 10.0
    request_timeout_s: float = 5.0
    auth: tuple[str, str] | None = field(default=None, repr=False)  # holds the password

    def __post_init__(self) -> None:
        if not self.hosts or "/" in self.hosts:
            raise ValueError(
                f"zookeeper.hosts {self.hosts!r}: give host:port pairs separated by commas; "
                "put the chroot in zookeeper.root"
            )
        if not self.root.startswith("/") or self.root.endswith("/") or "//" in self.root:
            raise ValueError(
                f"zookeeper.root {self.root!r}: must be an absolute path like /hakafka/prod"
            )
        for key in ("session_timeout_s", "connect_timeout_s", "request_timeout_s"):
            if getattr(self, key) <= 0:
                raise ValueError(f"zookeeper.{key} must be positive, got {getattr(self, key)}")

    def acl(self) -> list[ACL]:
        """The ACL for every znode this session creates."""
        if self.auth is None:
            return list(OPEN_ACL_UNSAFE)
        user, password = self.auth
        return [make_digest_acl(user, password, all=True)]

    def client(self, *, chroot: bool) -> KazooClient:
        """A new, unstarted KazooClient for this config."""
        auth_data = None
        if self.auth is not None:
            auth_data = [("digest", f"{self.auth[0]}:{self.auth[1]}")]
        hosts = f"{self.hosts}{self.root}" if chroot else self.hosts
        # Reconnect for as long as it takes (a daemon must rejoin once ZooKeeper is back) but
        # with a short delay cap; each individual call has its own timeout instead.
        retry = KazooRetry(max_tries=-1, delay=0.1, backoff=2, max_delay=1.0, max_jitter=0.2)
        return KazooClient(
            hosts=hosts,
            timeout=self.session_timeout_s,
            connection_retry=retry,
            command_retry=None,
            auth_data=auth_data,
            default_acl=self.acl(),
        )


class ZkSession:
    """A started KazooClient under the configured root, with timed calls."""

    def __init__(self, config: ZkConfig) -> None:
        self.config = config
        self.client = config.client(chroot=True)

    def start(self) -> None:
        """Create the root if missing, then connect; raises ZooKeeperUnavailableError on timeout."""
        boot = self.config.client(chroot=False)
        try:
            boot.start(timeout=self.config.connect_timeout_s)
        except KazooTimeoutError:
            raise ZooKeeperUnavailableError(
                f"cannot connect to ZooKeeper at {self.config.hosts} within "
                f"{self.config.connect_timeout_s} s"
            ) from None
        try:
            # The root's ancestors are shared by other clusters and tools: only the root (and
            # everything below it) gets this cluster's ACL.
            parent = self.config.root.rsplit("/", 1)[0]
            if parent:
                self._wait(boot.ensure_path_async(parent, list(OPEN_ACL_UNSAFE)), "ensure", parent)
            self._wait(boot.ensure_path_async(self.config.root, self.config.acl()), "ensure", "/")
        finally:
            boot.stop()
            boot.close()
        try:
            self.client.start(timeout=self.config.connect_timeout_s)
        except KazooTimeoutError:
            raise ZooKeeperUnavailableError(
                f"cannot connect to ZooKeeper at {self.config.hosts}{self.config.root} within "
                f"{self.config.connect_timeout_s} s"
            ) from None
        log.info("zookeeper.connected", hosts=self.config.hosts, root=self.config.root)

    def close(self) -> None:
        """End the session (its ephemeral znodes vanish) and free the client."""
        try:
            self.client.stop()
        finally:
            self.client.close()

    def add_listener(self, listener: Callable[[KazooState], None]) -> None:
        """Call `listener(state)` on every connection state change (on kazoo's thread)."""
        self.client.add_listener(listener)

    @property
    def connected(self) -> bool:
        return bool(self.client.connected)

    @property
    def session_id(self) -> int | None:
        """The current session's id, or None when there is no session."""
        sid = self.client.client_id
        return None if sid is None else int(sid[0])

    def _wait(self, result: Any, op: str, path: str) -> Any:
        timeout = self.config.request_timeout_s
        try:
            return result.get(timeout=timeout)
        except KazooTimeoutError:
            raise ZooKeeperUnavailableError(
                f"ZooKeeper {op} {path}: no answer within {timeout} s"
            ) from None
        except (ConnectionLoss, ConnectionClosedError, SessionExpiredError) as exc:
            raise ZooKeeperUnavailableError(
                f"ZooKeeper {op} {path}: {type(exc).__name__} (outcome unknown)"
            ) from exc

    def get(self, path: str, watch: Watch | None = None) -> tuple[bytes, ZnodeStat] | None:
        """(data, stat) of `path`, or None if it does not exist (the watch is then not set)."""
        try:
            data, stat = self._wait(self.client.get_async(path, watch), "get", path)
        except NoNodeError:
            return None
        return bytes(data or b""), stat

    def exists(self, path: str, watch: Watch | None = None) -> ZnodeStat | None:
        """The stat of `path` or None; a watch fires on its creation, change or deletion."""
        stat: ZnodeStat | None = self._wait(self.client.exists_async(path, watch), "exists", path)
        return stat

    def children(self, path: str, watch: Watch | None = None) -> list[str]:
        """The child names of `path` ([] if it does not exist)."""
        try:
            names: list[str] = self._wait(
                self.client.get_children_async(path, watch), "children", path
            )
        except NoNodeError:
            return []
        return names

    def create(
        self, path: str, data: bytes, *, ephemeral: bool = False, sequence: bool = False
    ) -> str:
        """Create `path` and return its actual path (NodeExistsError if it exists)."""
        created: str = self._wait(
            self.client.create_async(path, data, ephemeral=ephemeral, sequence=sequence),
            "create",
            path,
        )
        return created

    def set(self, path: str, data: bytes, version: int = -1) -> ZnodeStat:
        stat: ZnodeStat = self._wait(self.client.set_async(path, data, version), "set", path)
        return stat

    def delete(self, path: str, version: int = -1) -> bool:
        """Delete `path`; False if it did not exist."""
        try:
            self._wait(self.client.delete_async(path, version), "delete", path)
        except NoNodeError:
            return False
        return True

    def ensure(self, path: str) -> None:
        """Create `path` and its parents as persistent znodes if missing."""
        self._wait(self.client.ensure_path_async(path, self.config.acl()), "ensure", path)

    def transaction(self) -> Any:
        """A new kazoo TransactionRequest; run it with `commit`."""
        return self.client.transaction()

    def commit(self, txn: Any, what: str) -> list[Any]:
        """Commit a transaction; returns kazoo's per-op results (exceptions on failure)."""
        results: list[Any] = self._wait(txn.commit_async(), "multi", what)
        return results
