"""Ops failover requests (`shards/<s>/failover`): validation, creation and reading."""

from __future__ import annotations

import time

import structlog
from kazoo.exceptions import NodeExistsError
from kazoo.protocol.states import ZnodeStat

from hakafka.coordination import paths
from hakafka.coordination.errors import FailoverRefused
from hakafka.coordination.records import FailoverRequest
from hakafka.coordination.registry import Registry
from hakafka.coordination.session import Watch, ZkSession

log = structlog.get_logger("hakafka.coordination")


def read_request(
    session: ZkSession, shard: int, watch: Watch | None = None
) -> tuple[FailoverRequest, ZnodeStat] | None:
    """The pending request of `shard` and its stat, or None; `watch` fires on any change."""
    path = paths.failover(shard)
    if session.exists(path, watch) is None:
        return None
    got = session.get(path)
    if got is None:
        return None
    return FailoverRequest.decode(path, got[0]), got[1]


def candidate_nodes(session: ZkSession, shard: int) -> set[str]:
    """The nodes with a candidate znode in `shard`'s election."""
    found: set[str] = set()
    for name in session.children(paths.election(shard)):
        got = session.get(paths.candidate(shard, name))
        if got is not None:
            found.add(got[0].decode("utf-8", errors="replace"))
    return found


def request_failover(
    session: ZkSession,
    registry: Registry,
    shard: int,
    *,
    to: str | None,
    by: str,
    timeout_s: float,
    token: int | None = None,
) -> FailoverRequest:
    """Ask `shard`'s leader to hand over (to node `to`, or to whoever is next).

    Refused with `FailoverRefused` when `to` is not registered, is under replacement or is
    not a candidate of the shard, when another request is pending, or, with `token` (a
    leader asking about its own shard), when the shard's term is no longer the one of that
    fencing token: the request is created in one multi-op that checks it.
    """
    pending = read_request(session, shard)
    if pending is not None:
        raise FailoverRefused(
            f"shard {shard}: a failover request is already pending ({pending[0]})"
        )
    if to is not None:
        paths.check_name("node", to)
        if to not in registry.nodes():
            raise FailoverRefused(
                f"shard {shard}: cannot fail over to {to}: node {to} is not registered "
                f"(no {paths.node(to)}: it is not running or uses another root)"
            )
        flagged = registry.replacing().get(to)
        if flagged is not None:
            raise FailoverRefused(
                f"shard {shard}: cannot fail over to {to}: node {to} is under replacement "
                f"(since {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(flagged.since))} UTC, "
                f"by {flagged.by}: {flagged.reason})"
            )
        if to not in candidate_nodes(session, shard):
            raise FailoverRefused(
                f"shard {shard}: cannot fail over to {to}: node {to} is not a candidate of "
                f"shard {shard} (it does not serve this shard)"
            )
    now = time.time()
    request = FailoverRequest(by=by, to=to, at=now, deadline=now + timeout_s)
    if token is not None:
        txn = session.transaction()
        txn.check(paths.epoch(shard), token)
        txn.create(paths.failover(shard), request.encode())
        errors = [r for r in session.commit(txn, paths.failover(shard)) if isinstance(r, Exception)]
        if errors:
            raise FailoverRefused(
                f"shard {shard}: not made: its term of token {token} is over, or a request "
                f"was made just now ({', '.join(type(e).__name__ for e in errors)})"
            )
        log.info("failover.requested", shard=shard, to=to, by=by, deadline=request.deadline)
        return request
    try:
        session.create(paths.failover(shard), request.encode())
    except NodeExistsError:
        raise FailoverRefused(
            f"shard {shard}: a failover request is already pending (made just now)"
        ) from None
    log.info("failover.requested", shard=shard, to=to, by=by, deadline=request.deadline)
    return request
