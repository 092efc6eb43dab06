"""The errors the coordination layer raises; each message names the shard, node or znode."""

from __future__ import annotations


class CoordinationError(RuntimeError):
    """Base class: something about ZooKeeper coordination went wrong (the text says what)."""


class ZooKeeperUnavailableError(CoordinationError):
    """A ZooKeeper call did not complete within its timeout, or the connection dropped while
    it was in flight (its outcome is then unknown)."""


class FencedError(CoordinationError):
    """A write of fenced state was refused: this process is not (or no longer) the shard's
    leader with the epoch version it holds. The write did not happen."""


class FailoverRefused(CoordinationError):  # noqa: N818 (the name the daemon and CLI use)
    """An ops failover request cannot be honoured (target not registered, under replacement,
    not a candidate, or another request is pending)."""


class CorruptZnodeError(CoordinationError):
    """A znode holds data that is not the JSON record the layout says it holds."""


class OpenAclError(CoordinationError):
    """`zookeeper.require_acl` is set and the root's ACL lets anyone change it."""


class NodeIdTakenError(CoordinationError):
    """Another live ZooKeeper session holds `nodes/<node>`: a second daemon with this node id."""
