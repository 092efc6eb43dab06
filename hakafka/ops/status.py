"""`hakafka status`: the cluster as ZooKeeper and each node's `/status` see it."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from hakafka.config import Config
from hakafka.coordination import Coordinator
from hakafka.ops.cluster import OpsError, clock, fetch_json, format_table
from hakafka.settings import client_tls


def cluster_status(coordinator: Coordinator, config: Config) -> dict[str, Any]:
    """`shards` (leader, epoch, since, status), `pipelines` (per shard, from its leader's
    view: state, lag per partition, buffer, last flush, pending intent), `nodes` (alive,
    endpoints, replacing) and `healthy`: every shard has a consuming leader whose pipelines
    all consume (waiting for nothing but a flush) or are paused by ops."""
    token = config.server.token.value or None
    tls = client_tls(config)
    registered = coordinator.nodes()
    replacing = coordinator.replacing()
    views: dict[str, dict[str, Any]] = {}
    errors: dict[str, str] = {}
    for name, endpoints in registered.items():
        try:
            views[name] = fetch_json(endpoints.http, "/status", token, tls)
        except OpsError as exc:
            errors[name] = str(exc)

    shards: list[dict[str, Any]] = []
    pipelines: list[dict[str, Any]] = []
    for shard in range(config.shard_count):
        leader = coordinator.leader_of(shard)
        shards.append(
            {
                "shard": shard,
                "leader": None if leader is None else leader.node,
                "epoch": None if leader is None else leader.epoch,
                "since": None if leader is None else leader.since,
                "status": "no leader" if leader is None else leader.status,
            }
        )
        if leader is not None:
            pipelines += _pipelines_of(shard, leader.node, views, errors)

    known = set(registered) | set(replacing)
    known |= {n for nodes in config.clickhouse.replicas.values() for n in nodes}
    nodes = []
    for name in sorted(known):
        info = registered.get(name)
        flag = replacing.get(name)
        nodes.append(
            {
                "node": name,
                "alive": info is not None,
                "host": None if info is None else info.host,
                "http": None if info is None else info.http,
                "flight": None if info is None else info.flight,
                "version": None if info is None else info.version,
                "healthy": views.get(name, {}).get("healthy"),
                "flush_path": views.get(name, {}).get("flush_path"),
                "error": errors.get(name) or _note_of(views.get(name, {})),
                "replacing": None if flag is None else asdict(flag),
            }
        )
    healthy = all(s["status"] == "consuming" for s in shards) and all(
        p["state"] in ("consuming", "paused")  # a pause is an ops decision
        # A consuming pipeline that waits moves no data (a full buffer is normal under load).
        and all(w["state"] == "buffer_full" for w in p.get("waiting", []))
        for p in pipelines
    )
    return {"shards": shards, "pipelines": pipelines, "nodes": nodes, "healthy": healthy}


def _note_of(view: dict[str, Any]) -> str | None:
    """Why a node stands in fewer shards than it serves: its settings drift (none), or the
    shards it handed over and stays out of for a while; None if neither."""
    drift = view.get("settings_drift")
    if drift:
        return "settings drift: " + "; ".join(drift)
    notes = [
        f"handed shard {entry['shard']} over ({cooldown['reason']}), stands again in "
        f"{cooldown['stands_again_in_s']:.0f} s"
        for entry in view.get("shards", [])
        if (cooldown := entry.get("cooldown"))
    ]
    return "; ".join(notes) or None


def _pipelines_of(
    shard: int, leader: str, views: dict[str, dict[str, Any]], errors: dict[str, str]
) -> list[dict[str, Any]]:
    view = views.get(leader)
    if view is None:
        why = errors.get(leader, f"{leader} is not registered")
        return [
            {"shard": shard, "node": leader, "pipeline": None, "state": "unknown", "error": why}
        ]
    found = []
    for entry in view.get("shards", []):
        if entry.get("shard") != shard:
            continue
        for p in entry.get("pipelines", []):
            found.append(
                {
                    "shard": shard,
                    "node": leader,
                    "pipeline": p["name"],
                    "state": p["state"],
                    "error": p["error"],
                    "waiting": p.get("waiting", []),
                    "lag": {int(k): v for k, v in p["lag"].items()},
                    "buffer_rows": p["buffer_rows"],
                    "buffer_bytes": p["buffer_bytes"],
                    "last_flush_at": p["last_flush_at"],
                    "last_flush_rows": p["last_flush_rows"],
                    "last_flush_seconds": p["last_flush_seconds"],
                    "pending_block": p["pending_block"],
                    "reflushing": p.get("reflushing", False),
                }
            )
        for name in entry.get("paused", []):
            found.append(
                {"shard": shard, "node": leader, "pipeline": name, "state": "paused", "error": None}
            )
    return found


def state_text(p: dict[str, Any]) -> str:
    """`consuming`, `consuming, re-flushing pending <block>`, `failed: <error>`,
    `consuming, waiting_for_topic for 35 s: topic clicks does not exist`."""
    text = str(p["state"])
    if p.get("reflushing"):
        text += f", re-flushing pending {p.get('pending_block')}"
    waits = p.get("waiting") or []
    for wait in waits:
        text += f", {wait['state']} for {wait['for_s']:.0f} s: {wait['detail']}"
    return f"{text}: {p['error']}" if p.get("error") and not waits else text


def flush_path_text(path: dict[str, Any] | None) -> str | None:
    """`warm`, `starting for 4 s`, `cold`, `failed: <error>` (None: the node did not say)."""
    if path is None:
        return None
    if path["state"] == "starting":
        return f"starting for {path['for_s']:.0f} s"
    if path["state"] == "failed":
        return f"failed: {path['error']}"
    return str(path["state"])


def render(status: dict[str, Any]) -> str:
    """The three tables `hakafka status` prints."""
    shards = format_table(
        ["SHARD", "LEADER", "EPOCH", "STATUS", "SINCE"],
        [
            [s["shard"], s["leader"], s["epoch"], s["status"], clock(s["since"])]
            for s in status["shards"]
        ],
    )
    rows = []
    for p in status["pipelines"]:
        lag = p.get("lag")
        lag_text = (
            None
            if lag is None
            else f"{sum(lag.values())} ("
            + " ".join(f"p{k}={v}" for k, v in sorted(lag.items()))
            + ")"
        )
        flush = (
            None
            if p.get("last_flush_at") is None
            else f"{clock(p['last_flush_at'])}: {p['last_flush_rows']} rows "
            f"in {p['last_flush_seconds']:.2f}s"
        )
        rows.append(
            [
                p["shard"],
                p["pipeline"],
                p["node"],
                state_text(p),
                lag_text,
                p.get("buffer_rows"),
                p.get("buffer_bytes"),
                flush,
                p.get("pending_block"),
            ]
        )
    pipelines = format_table(
        [
            "SHARD",
            "PIPELINE",
            "NODE",
            "STATE",
            "LAG (per partition)",
            "BUFFER ROWS",
            "BUFFER BYTES",
            "LAST FLUSH",
            "PENDING",
        ],
        rows,
    )
    nodes = format_table(
        ["NODE", "ALIVE", "HEALTHY", "FLUSH PATH", "HTTP", "FLIGHT", "REPLACING"],
        [
            [
                n["node"],
                "yes" if n["alive"] else "no",
                n["error"] or n["healthy"],
                flush_path_text(n.get("flush_path")),
                n["http"],
                n["flight"],
                None
                if n["replacing"] is None
                else f"since {clock(n['replacing']['since'])} by {n['replacing']['by']}: "
                f"{n['replacing']['reason']}",
            ]
            for n in status["nodes"]
        ],
    )
    return f"{shards}\n\n{pipelines}\n\n{nodes}"
