"""The balancer's decision (`plan_move`) on views built by hand: no ZooKeeper here."""

from __future__ import annotations

from collections import Counter

from hakafka.coordination.balance import FleetView, ShardView, eligible_nodes, plan_move, share
from hakafka.coordination.records import LeaderInfo

NOW = 10_000.0
SETTLE = 30.0
OLD = NOW - 100.0  # a term older than SETTLE


def _view(
    leaders: dict[int, str], candidates: dict[int, set[str]], *, chain: bool = False, **pins: str
) -> FleetView:
    """Every shard as `mine` (a node moves only shards it leads); with `chain`, the whole
    cluster for the chain step too."""
    mine = tuple(
        ShardView(
            s,
            LeaderInfo(node=leaders[s], epoch=1, since=OLD) if s in leaders else None,
            frozenset(candidates[s]),
            pins.get(f"s{s}"),
        )
        for s in sorted(candidates)
    )
    return FleetView(mine, dict(Counter(leaders.values())), mine if chain else ())


def _settle(
    leaders: dict[int, str], candidates: dict[int, set[str]], limit: int = 50, chain: bool = False
) -> int:
    """Apply every node's move until nobody moves; the number of moves."""
    for moves in range(limit):
        planned = [
            plan_move(node, _view(leaders, candidates, chain=chain), now=NOW, settle_s=SETTLE)
            for node in sorted(set(leaders.values()))
        ]
        move = next((m for m in planned if m is not None), None)
        if move is None:
            return moves
        leaders[move.shard] = move.target
    raise AssertionError(f"no balance after {limit} moves: {leaders}")


def test_two_nodes_serving_four_shards_end_up_leading_two_each() -> None:
    both = {s: {"a", "b"} for s in range(4)}
    leaders = {s: "b" for s in range(4)}  # b was up first and took every shard
    move = plan_move("b", _view(leaders, both), now=NOW, settle_s=SETTLE)
    assert move is not None
    assert (move.shard, move.source, move.target, move.share) == (0, "b", "a", 2)
    assert move.why() == "b leads 4 shards (share 2), a leads 0"
    assert plan_move("a", _view(leaders, both), now=NOW, settle_s=SETTLE) is None
    assert _settle(leaders, both) == 2
    assert Counter(leaders.values()) == {"a": 2, "b": 2}


def test_an_odd_count_stops_at_a_difference_of_one() -> None:
    both = {s: {"a", "b"} for s in range(5)}
    leaders = {s: "a" for s in range(5)}
    assert _settle(leaders, both) == 2
    assert sorted(Counter(leaders.values()).values()) == [2, 3]


def test_a_fleet_of_two_replicas_per_shard_settles_within_its_shares() -> None:
    nodes = [f"n{i:02d}" for i in range(30)]
    # 100 shards, each on two nodes next to each other in a ring; the first node up of each
    # pair leads (the worst start: the lower name of every pair).
    candidates = {s: {nodes[s % 30], nodes[(s + 1) % 30]} for s in range(100)}

    def over(leaders: dict[int, str]) -> dict[str, int]:
        led = Counter(leaders.values())
        shares = {n: share(n, _view(leaders, candidates).mine) for n in nodes}
        return {n: led[n] - shares[n] for n in nodes if led[n] > shares[n]}

    chained = {s: min(candidates[s]) for s in range(100)}
    moves = _settle(chained, candidates, limit=300, chain=True)
    assert over(chained) == {}
    assert moves <= 150


def test_the_chain_step_goes_one_hop_toward_the_nearest_node_under_its_share() -> None:
    # A line a - b - c: shares a 1, b 2, c 1. a leads two (over by one), b two (its share), c
    # none. No direct move (b leads as many as a): a gives a shard to b, which then leads one
    # over its share and gives one of its own to c; nothing comes back to a.
    line = {0: {"a", "b"}, 1: {"a", "b"}, 2: {"b", "c"}, 3: {"b", "c"}}
    leaders = {0: "a", 1: "a", 2: "b", 3: "b"}
    assert plan_move("a", _view(leaders, line), now=NOW, settle_s=SETTLE) is None
    move = plan_move("a", _view(leaders, line, chain=True), now=NOW, settle_s=SETTLE)
    assert move is not None and (move.source, move.target) == ("a", "b")
    assert _settle(leaders, line, chain=True) == 2
    assert sorted(Counter(leaders.values()).items()) == [("a", 1), ("b", 2), ("c", 1)]


def test_a_pinned_shard_a_young_term_and_a_lone_candidate_stay() -> None:
    both = {0: {"a", "b"}, 1: {"a", "b"}, 2: {"a"}}
    leaders = {0: "a", 1: "a", 2: "a"}
    # share(a) = 1/2 + 1/2 + 1 = 2 and a leads 3; shard 0 is pinned, shard 2 has nobody else.
    move = plan_move("a", _view(leaders, both, s0="a"), now=NOW, settle_s=SETTLE)
    assert move is not None and (move.shard, move.target) == (1, "b")
    # A pin to a node that does not lead the shard (its hand-over failed) holds nothing.
    move = plan_move("a", _view(leaders, both, s0="b", s1="b"), now=NOW, settle_s=SETTLE)
    assert move is not None and (move.shard, move.target) == (0, "b")
    young = _view(leaders, both, s0="a")
    young_mine = tuple(
        ShardView(v.shard, LeaderInfo(node="a", epoch=2, since=NOW - 5), v.candidates, v.pinned_to)
        for v in young.mine
    )
    assert plan_move("a", FleetView(young_mine, young.leads), now=NOW, settle_s=SETTLE) is None


def test_a_target_leading_elsewhere_counts_all_it_leads() -> None:
    # a leads 2 here; b is a candidate but leads 3 shards a does not serve: no move.
    mine = {0: {"a", "b"}, 1: {"a", "b"}}
    view = _view({0: "a", 1: "a"}, mine)
    assert share("a", view.mine) == 1
    crowded = FleetView(view.mine, {"a": 2, "b": 3})
    assert plan_move("a", crowded, now=NOW, settle_s=SETTLE) is None
    assert plan_move("a", FleetView(view.mine, {"a": 2, "b": 0}), now=NOW, settle_s=SETTLE)


def test_eligible_nodes_leave_out_the_replaced_and_the_newly_registered() -> None:
    # b registered a second ago (a restart, or a session that expired and came back).
    registered = {"a": OLD, "b": NOW - 1, "c": OLD, "d": OLD}
    assert eligible_nodes("b", registered, ["c"], now=NOW, settle_s=SETTLE) == {"a", "b", "d"}
    assert eligible_nodes("a", registered, ["c"], now=NOW, settle_s=SETTLE) == {"a", "d"}
