"""Leadership balance: which shard, if any, an over-loaded leader hands to whom.

Every daemon decides for itself, from what ZooKeeper shows (see docs/DESIGN.md, "Leadership
balance"): a node whose led shards exceed its share of the shards it serves hands one of them
over, through the ops failover path (a graceful hand-over), to a co-candidate that leads at
least two fewer. Only the leader moves its own shards, one at a time, so two nodes never move
one shard; a move lowers the spread, so the fleet settles.

- A node's share is the ceiling of the sum, over the shards it stands for, of one over the
  number of eligible candidates of that shard: 2 of 4 shards with two replicas each.
- Eligible: registered (this session) for at least `settle_s` and not under replacement (a
  node that flaps, or whose session does, is never handed anything).
- A shard moves only when its leader's term is older than `settle_s` and no ops pin holds it
  on its leader; the request is fenced by the leader's token (a term that ended meanwhile
  moves nothing).

`read_shards` reads that view: the shards a node serves at every look, every shard of the
cluster only when `over_share` says the node leads more than its share; `plan_move` is the
decision, free of I/O.
"""

from __future__ import annotations

import collections
import math
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from hakafka.coordination import paths
from hakafka.coordination.records import LeaderInfo, PinRecord
from hakafka.coordination.session import ZkSession


@dataclass(frozen=True)
class ShardView:
    """One shard as the balancer sees it: its leader (None: none now), the eligible nodes
    standing in its election, and the node an ops pin holds it on (None: no live pin)."""

    shard: int
    leader: LeaderInfo | None
    candidates: frozenset[str]
    pinned_to: str | None = None


@dataclass(frozen=True)
class FleetView:
    """What one node's balancer read: the shards it stands for (`mine`), how many shards
    each node leads in the whole cluster (`leads`) and, for the chain step, every shard of
    the cluster (`everyone`; empty: not read)."""

    mine: tuple[ShardView, ...]
    leads: Mapping[str, int]
    everyone: tuple[ShardView, ...] = ()


@dataclass(frozen=True)
class Move:
    """Hand `shard` from `source` to `target`: `source` leads `source_leads` shards against a
    share of `share`; `target` leads `target_leads`."""

    shard: int
    source: str
    target: str
    source_leads: int
    target_leads: int
    share: int

    def why(self) -> str:
        return (
            f"{self.source} leads {self.source_leads} shards (share {self.share}),"
            f" {self.target} leads {self.target_leads}"
        )


def share(node: str, mine: Iterable[ShardView]) -> int:
    """`node`'s fair number of led shards among the shards in `mine`: the ceiling of the
    sum of 1 / eligible candidates over the shards it is an eligible candidate of."""
    weight = sum(1.0 / len(v.candidates) for v in mine if node in v.candidates)
    return math.ceil(weight - 1e-9)


def plan_move(node: str, view: FleetView, *, now: float, settle_s: float) -> Move | None:
    """The move `node` should make now, or None. Only while `node` leads more than its share,
    and only a shard it leads whose term is older than `settle_s` and that no pin holds on it:
    - directly, to the eligible co-candidate leading the fewest shards, if that one leads two
      or more fewer;
    - else one step of a chain (with `view.everyone`): toward the nearest node under its share
      (fewest hops over shared shards), to a neighbour on the way that is not over its own
      share. The surplus moves one hop closer at every step, so it never comes back.
    Ties go to the lowest shard, then to a target in an order that differs between movers
    (two movers looking at once rarely pick the same one)."""
    led = [v for v in view.mine if v.leader is not None and v.leader.node == node]
    fair = share(node, view.mine)
    count = view.leads.get(node, len(led))
    if count <= fair:
        return None
    movable = [
        v
        for v in sorted(led, key=lambda v: v.shard)
        if v.pinned_to != node and v.leader is not None and now - v.leader.since >= settle_s
    ]
    best: Move | None = None
    for v in movable:
        # Movers that look at once spread over the targets leading fewest alike.
        for target in sorted(v.candidates - {node}, key=lambda t: _spread(node, v.shard, t)):
            theirs = view.leads.get(target, 0)
            if theirs + 2 > count or (best is not None and theirs >= best.target_leads):
                continue
            best = Move(v.shard, node, target, count, theirs, fair)
    if best is not None or not view.everyone:
        return best
    hops = _toward_deficit(node, view)
    for v in movable:
        for target in sorted(v.candidates & hops, key=lambda t: _spread(node, v.shard, t)):
            return Move(v.shard, node, target, count, view.leads.get(target, 0), fair)
    return None


def _toward_deficit(node: str, view: FleetView) -> set[str]:
    """The neighbours of `node` (co-candidates of a shard) that lie on a shortest path to
    the nearest node leading fewer than its share and are not over their own share."""
    graph: dict[str, set[str]] = {}
    for v in view.everyone:
        for member in v.candidates:
            graph.setdefault(member, set()).update(v.candidates - {member})

    def excess(n: str) -> int:
        return view.leads.get(n, 0) - share(n, view.everyone)

    distance: dict[str, int] = {node: 0}
    first_hop: dict[str, str] = {}
    queue = collections.deque([node])
    while queue:
        here = queue.popleft()
        for there in sorted(graph.get(here, ())):
            if there not in distance:
                distance[there] = distance[here] + 1
                first_hop[there] = there if here == node else first_hop[here]
                queue.append(there)
    deficits = [n for n in distance if n != node and excess(n) < 0]
    if not deficits:
        return set()
    nearest = min(distance[n] for n in deficits)
    return {first_hop[n] for n in deficits if distance[n] == nearest and excess(first_hop[n]) <= 0}


def _spread(node: str, shard: int, target: str) -> int:
    """An order of the targets that differs between movers and shards but not between runs."""
    return zlib.crc32(f"{node}/{shard}/{target}".encode())


def eligible_nodes(
    node: str,
    registered: Mapping[str, float],
    replacing: Iterable[str],
    *,
    now: float,
    settle_s: float,
) -> set[str]:
    """The nodes registered (node -> since, Unix time) for at least `settle_s` and not under
    replacement, and `node` itself unless it is under replacement (its share counts from its
    first moment). A node whose session expired registers anew: it settles again."""
    flagged = set(replacing)
    settled = {n for n, since in registered.items() if now - since >= settle_s}
    return (settled | {node}) - flagged


def read_shards(
    session: ZkSession,
    mine: Iterable[int],
    eligible: set[str],
    known: dict[str, str],
    *,
    now: float,
    pins: bool = True,
) -> tuple[ShardView, ...]:
    """For each shard in `mine`: its leader, its candidates that are `eligible`, and (with
    `pins`) its live pin. `known` caches candidate znode path -> node across calls (a
    candidate's name is never reused), so a steady election costs one children read per
    shard."""
    views, seen = [], {}
    for shard in mine:
        got = session.get(paths.leader(shard))
        leader = None if got is None else LeaderInfo.decode(paths.leader(shard), got[0])
        standing = set()
        for name in session.children(paths.election(shard)):
            path = paths.candidate(shard, name)
            if path not in known:
                found = session.get(path)
                if found is None:
                    continue
                known[path] = found[0].decode("utf-8", errors="replace")
            seen[path] = known[path]
            standing.add(known[path])
        pin = read_pin(session, shard) if pins else None
        live_pin = pin.node if pin is not None and pin.until > now else None
        views.append(ShardView(shard, leader, frozenset(standing & eligible), live_pin))
    known.clear()  # only the candidates standing now: the cache does not grow with elections
    known.update(seen)
    return tuple(views)


def leads_of(views: Iterable[ShardView]) -> dict[str, int]:
    """How many of `views`' shards each node leads."""
    leads: dict[str, int] = {}
    for v in views:
        if v.leader is not None:
            leads[v.leader.node] = leads.get(v.leader.node, 0) + 1
    return leads


def over_share(node: str, mine: Iterable[ShardView]) -> bool:
    """True if `node` leads more of `mine` than its share: only then is the whole cluster's
    shard read (`read_shards` of all of them)."""
    views = list(mine)
    led = sum(1 for v in views if v.leader is not None and v.leader.node == node)
    return led > share(node, views)


def read_pin(session: ZkSession, shard: int) -> PinRecord | None:
    """The ops pin of `shard` (`hakafka failover --hold`), expired or not; None if none."""
    got = session.get(paths.pin(shard))
    return None if got is None else PinRecord.decode(paths.pin(shard), got[0])


def write_pin(session: ZkSession, shard: int, pin: PinRecord | None) -> None:
    """Set `shard`'s pin to `pin`, or remove it (None)."""
    path = paths.pin(shard)
    if pin is None:
        session.delete(path)
    elif session.exists(path) is None:
        session.create(path, pin.encode())
    else:
        session.set(path, pin.encode())
