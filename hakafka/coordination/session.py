"""One ZooKeeper session: KazooClient construction from `ZkConfig` (hosts, root as chroot,
session timeout, digest auth and ACLs) and ZooKeeper calls that never block forever.

Every call waits at most `request_timeout_s` and raises `ZooKeeperUnavailableError` otherwise, or
when the connection dropped while the call was in flight.

ACLs: with auth, every znode this session creates is readable and writable by the configured
digest user only. A root created earlier without auth keeps its open ACL (ZooKeeper never
changes an existing znode's ACL by itself): `check_root_acl` reports it (a warning, or
`OpenAclError` under `require_acl`) and `restrict_acl` (run by `hakafka init`) closes it.
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
    NoAuthError,
    NoNodeError,
    SessionExpiredError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import ZnodeStat
from kazoo.retry import KazooRetry
from kazoo.security import ACL, OPEN_ACL_UNSAFE, Permissions, make_digest_acl

from hakafka.coordination import paths
from hakafka.coordination.errors import (
    CoordinationError,
    OpenAclError,
    ZooKeeperUnavailableError,
)

log = structlog.get_logger("hakafka.coordination")

Watch = Callable[[Any], None]

# What "anyone may change it" means: any permission of world:anyone beyond READ.
_CHANGES = {
    "write": Permissions.WRITE,
    "create": Permissions.CREATE,
    "delete": Permissions.DELETE,
    "admin": Permissions.ADMIN,
}


@dataclass(frozen=True)
class ZkTls:
    """TLS to ZooKeeper's `secureClientPort`: the server's certificate is verified against
    `ca_file` (None: the system's CAs) and the host it is reached at; `cert_file` and
    `key_file` (PEM) are this client's, for servers that require one."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None


@dataclass(frozen=True)
class ZkConfig:
    """How to reach ZooKeeper.

    `hosts` is a connect string (`h1:2181,h2:2181`); `root` is the chroot every path lives
    under (created on start if missing). With `auth` (user, password) the session
    authenticates with digest auth and every znode it creates is readable and writable only
    by that user. `require_acl` makes a root that anyone may change (`world:anyone` with more
    than read) a refusal to register instead of a warning.
    """

    hosts: str
    root: str = "/hakafka/default"
    session_timeout_s: float = 6.0
    connect_timeout_s: float = 10.0
    request_timeout_s: float = 5.0
    auth: tuple[str, str] | None = field(default=None, repr=False)  # holds the password
    require_acl: bool = False
    tls: ZkTls | None = None

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
        tls = self.tls
        return KazooClient(
            hosts=hosts,
            timeout=self.session_timeout_s,
            connection_retry=retry,
            command_retry=None,
            auth_data=auth_data,
            default_acl=self.acl(),
            use_ssl=tls is not None,
            ca=None if tls is None else tls.ca_file,
            certfile=None if tls is None else tls.cert_file,
            keyfile=None if tls is None else tls.key_file,
            verify_certs=True,
            check_hostname=tls is not None,  # kazoo's default is False: any CA-signed cert
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

    def remove_listener(self, listener: Callable[[KazooState], None]) -> None:
        """Stop calling a listener `add_listener` added."""
        self.client.remove_listener(listener)

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

    def sync(self, path: str) -> None:
        """Bring this session's server up to the leader's state for `path`: ZooKeeper's reads
        are served by the member a session is connected to, which may lag others' writes;
        a read after `sync` sees every write the leader had when it answered."""
        self._wait(self.client.sync_async(path), "sync", path)

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

    def open_to_anyone(self) -> list[str]:
        """What the root's ACL lets anyone (`world:anyone`) do beyond reading: a subset of
        write, create, delete, admin; [] when only authenticated users may change it."""
        try:
            acls, _ = self._wait(self.client.get_acls_async("/"), "get_acls", "/")
        except NoAuthError:
            raise CoordinationError(
                f"ZooKeeper {self.config.hosts}{self.config.root}: the root's ACL does not "
                f"admit {self._who()}; set zookeeper.auth_user and the password of the user "
                "the cluster was initialized with"
            ) from None
        granted = 0
        for acl in acls:
            if acl.id.scheme == "world" and acl.id.id == "anyone":
                granted |= acl.perms
        return [name for name, perm in _CHANGES.items() if granted & perm]

    def check_root_acl(self) -> None:
        """Warn (`zookeeper.acl_open`) when anyone may change the root; with `require_acl`
        raise OpenAclError instead."""
        open_to = self.open_to_anyone()
        if not open_to:
            return
        root = self.config.root
        fix = (
            "set zookeeper.auth_user and auth_password_file on every node, then run "
            "`hakafka init` (it restricts the root and every znode under it to that user)"
        )
        if self.config.require_acl:
            raise OpenAclError(
                f"zookeeper.require_acl: the ACL of {root} lets anyone (world:anyone) "
                f"{', '.join(open_to)}: any client that reaches ZooKeeper could rewrite "
                f"checkpoints, leaders and failover or replacement flags; {fix}"
            )
        log.warning("zookeeper.acl_open", root=root, open_to=open_to, fix=fix)

    def restrict_acl(self) -> int:
        """Give the root and every znode under it this session's ACL (the auth user's only);
        returns how many were changed. ValueError without `auth`: there is no user to give
        them to."""
        if self.config.auth is None:
            raise ValueError("zookeeper.auth_user is not set: no ACL to restrict the root to")
        wanted = self.config.acl()
        changed = 0
        pending = ["/"]
        while pending:
            path = pending.pop()
            try:
                acls, _ = self._wait(self.client.get_acls_async(path), "get_acls", path)
                if list(acls) != wanted:
                    self._wait(self.client.set_acls_async(path, wanted), "set_acls", path)
                    changed += 1
            except NoNodeError:
                continue  # an ephemeral that ended meanwhile
            pending += [paths.child(path, name) for name in self.children(path)]
        log.info("zookeeper.acl_restricted", root=self.config.root, changed=changed)
        return changed

    def _who(self) -> str:
        return "anonymous clients" if self.config.auth is None else f"user {self.config.auth[0]}"

    def transaction(self) -> Any:
        """A new kazoo TransactionRequest; run it with `commit`."""
        return self.client.transaction()

    def commit(self, txn: Any, what: str) -> list[Any]:
        """Commit a transaction; returns kazoo's per-op results (exceptions on failure)."""
        results: list[Any] = self._wait(txn.commit_async(), "multi", what)
        return results
