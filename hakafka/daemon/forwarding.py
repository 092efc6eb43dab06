"""Where a query for a shard this node does not lead goes: to that shard's leader, once, with
the shard named (`buffer.client.SHARD_HEADER`), so that the leader reads only its tables.

A forwarded query names the node that forwarded it (`buffer.client.FORWARDED_BY`, a Flight
call header). The node receiving one never forwards it again: it answers when it leads the
shard, else refuses naming the shard and both nodes. A leader whose registered Flight
address is this node's own (two hosts both advertising loopback) is refused too, so a query
never loops back into the node that sent it.

Across a failover the shard's `leader` may name a node that died (until its session
expires) or have no one: the query waits for the next leader (`ask_leader`, up to
`wait_s`, the session timeout + 2 s by default), and is answered here if that is this node.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

import pyarrow as pa

from buffer.client import FORWARDED_BY, QueryFailedError
from buffer.client import query as remote_query
from buffer.sql import QueryError, shard_of
from buffer.tls import ClientTls
from hakafka.coordination import LeaderInfo, NodeInfo
from hakafka.coordination.leader_wait import (
    LeaderNotAnswering,
    LeaderUnavailableError,
    ask_leader,
)

FORWARD_TIMEOUT_S = 60.0


class ForwardingError(RuntimeError):
    """The query cannot be forwarded; the text names the shard, the nodes and why."""


class Directory(Protocol):
    """What forwarding reads from ZooKeeper (a `Coordinator`)."""

    @property
    def node_id(self) -> str: ...

    @property
    def endpoints(self) -> NodeInfo: ...

    def leader_of(self, shard: int) -> LeaderInfo | None: ...

    def nodes(self) -> dict[str, NodeInfo]: ...


@dataclass(frozen=True)
class Forwarder:
    """A `buffer.sql.Forward`: None (answer here) when this node leads the query's shard
    (the `shard` parameter, else any shard this node leads, else the first it serves), the
    leader's answer otherwise, over that shard's tables only; ForwardingError when that
    cannot be asked. A `shard` that is not a number is answered here: the engine refuses it."""

    directory: Directory
    shards: tuple[int, ...]
    leading: Callable[[], list[int]]
    token: str | None = field(repr=False)
    tls: ClientTls | None
    wait_s: float
    """How long to wait for the shard's next leader when it has none or it does not answer."""
    timeout_s: float = FORWARD_TIMEOUT_S

    def __call__(self, sql: str, params: Mapping[str, str]) -> pa.Table | None:
        try:
            shard = shard_of(params)
        except QueryError:
            return None
        mine = self.leading()
        if shard is None:
            if mine or not self.shards:
                return None
            shard = self.shards[0]
        if shard in mine:
            return None
        me = self.directory.node_id
        if (sender := params.get(FORWARDED_BY)) is not None:
            raise ForwardingError(
                f"shard {shard}: forwarded by {sender} to {me}, which does not lead it; "
                "a forwarded query is not forwarded again"
            )
        try:
            return ask_leader(
                shard,
                self.directory.leader_of,
                lambda leader: self._ask(leader, shard, sql),
                wait_s=self.wait_s,
            )
        except LeaderUnavailableError as exc:
            raise ForwardingError(str(exc)) from None

    def _ask(self, leader: LeaderInfo, shard: int, sql: str) -> pa.Table | None:
        """The answer of `leader` (None: this node leads the shard now: answer here)."""
        me = self.directory.node_id
        if shard in self.leading():
            return None
        if leader.node == me:
            raise LeaderNotAnswering(f"{me} won its election but leads it not yet")
        endpoints = self.directory.nodes().get(leader.node)
        if endpoints is None:
            raise LeaderNotAnswering(f"{leader.node} is not registered")
        if endpoints.flight == self.directory.endpoints.flight:
            raise ForwardingError(
                f"shard {shard}: its leader {leader.node} registered {endpoints.flight}, the "
                f"address of {me} itself; set server.advertise on both nodes"
            )
        try:
            return remote_query(
                endpoints.flight,
                sql,
                self.token,
                self.timeout_s,
                tls=self.tls,
                forwarded_by=me,
                shard=shard,
            )
        except QueryFailedError as exc:
            if exc.unavailable:
                raise LeaderNotAnswering(str(exc)) from exc
            raise
