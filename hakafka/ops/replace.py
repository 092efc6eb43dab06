"""`hakafka node replace`: flag a node under replacement (it leaves every election) or clear it."""

from __future__ import annotations

import time
from collections.abc import Set
from dataclasses import dataclass, field

from hakafka.config import Config
from hakafka.coordination import Coordinator
from hakafka.ops.cluster import Diagnosis, OpsError, wait_consuming_leader
from hakafka.ops.failover import Handover
from hakafka.ops.failover import describe as describe_handover


@dataclass(frozen=True)
class Replacement:
    """`node` is flagged; `moved` are the shards it led and where they went."""

    node: str
    reason: str
    moved: list[Handover] = field(default_factory=list)


def start(
    coordinator: Coordinator,
    config: Config,
    node: str,
    *,
    reason: str,
    wait_s: float,
    by: str,
    force: bool = False,
    diagnose: Diagnosis | None = None,
) -> Replacement:
    """Flag `node`; for every shard it led, wait up to `wait_s` until another node leads and
    consumes (OpsError if one does not; the flag stays).

    Refused (OpsError, nothing flagged) for a node the cluster does not know (neither
    registered, nor a ClickHouse replica in `config`, nor flagged already), and, unless
    `force`, when a shard would be left without a ClickHouse replica that takes flushes."""
    flagged = coordinator.replacing()
    known = set(coordinator.nodes()) | set(flagged)
    known |= {n for nodes in config.clickhouse.replicas.values() for n in nodes}
    if node not in known:
        registered = ", ".join(sorted(coordinator.nodes())) or "none"
        raise OpsError(
            f"node {node} is unknown: registered now: {registered}; all known: "
            f"{', '.join(sorted(known))}; nothing flagged"
        )
    stranded = _stranded_shards(config, flagged.keys() | {node})
    if stranded and not force:
        raise OpsError(
            f"flagging {node} leaves no writable ClickHouse replica for "
            + "; ".join(f"shard {s} (replicas: {', '.join(r)})" for s, r in stranded.items())
            + ": its flushes would fail until `--done`; add a replica first, or --force; "
            "nothing flagged"
        )
    led = [s for s in range(config.shard_count) if _leader(coordinator, s) == node]
    began = time.monotonic()
    coordinator.mark_replacing(node, reason, by)
    moved = []
    for shard in led:
        info = wait_consuming_leader(coordinator, shard, node, began + wait_s, diagnose)
        moved.append(
            Handover(shard, node, info.node, info.epoch, round(time.monotonic() - began, 3))
        )
    return Replacement(node, reason, moved)


def _stranded_shards(config: Config, flagged: Set[str]) -> dict[int, list[str]]:
    """The shards whose every ClickHouse replica (per `config`) is in `flagged`, with them."""
    return {
        shard: sorted(nodes)
        for shard, nodes in sorted(config.clickhouse.replicas.items())
        if nodes and set(nodes) <= flagged
    }


def done(coordinator: Coordinator, node: str) -> bool:
    """Make `node` eligible again; False if it was not flagged."""
    return coordinator.clear_replacing(node)


def describe(replacement: Replacement) -> str:
    """What `node replace --start` prints: the node flagged with its reason, then one line
    per shard it led saying where that shard went."""
    lines = [
        f"{replacement.node}: under replacement ({replacement.reason}); it leads no shard and "
        "gets no flush from now on"
    ]
    lines += [describe_handover(handover) for handover in replacement.moved]
    return "\n".join(lines)


def describe_done(node: str, *, cleared: bool) -> str:
    """What `node replace --done` prints: `node` eligible again, or that it was not flagged
    (`cleared` False)."""
    if cleared:
        return f"{node}: no longer under replacement; it stands for leadership again"
    return f"{node} was not under replacement (nothing to do)"


def done_json(node: str, *, cleared: bool) -> dict[str, object]:
    """What `node replace --done --json` prints: `node` and whether its mark was `cleared`."""
    return {"node": node, "cleared": cleared}


def _leader(coordinator: Coordinator, shard: int) -> str | None:
    info = coordinator.leader_of(shard)
    return None if info is None else info.node
