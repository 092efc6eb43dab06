"""`hakafka status`: the cluster as ZooKeeper and each node's `/status` see it."""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any

from hakafka.config import ENV_SERVER_TOKEN, Config
from hakafka.coordination import Coordinator
from hakafka.ops.cluster import Diagnosis, OpsError, clock, fetch_json, format_table, until
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
        pauses = {name: asdict(p) for name, p in coordinator.pauses.paused(shard).items()}
        pin = coordinator.pin_of(shard)
        shards.append(
            {
                "shard": shard,
                "leader": None if leader is None else leader.node,
                "epoch": None if leader is None else leader.epoch,
                "since": None if leader is None else leader.since,
                "status": "no leader" if leader is None else leader.status,
                "paused": sorted(pauses),
                "held": None if pin is None or pin.until <= time.time() else asdict(pin),
            }
        )
        if leader is not None:
            found = _pipelines_of(shard, leader.node, views, errors)
            for p in found:
                p["paused"] = pauses.get(p["pipeline"])
            pipelines += found

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
                "leads": sum(1 for s in shards if s["leader"] == name),
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
    reshard = coordinator.reshard.read()
    return {
        "shards": shards,
        "pipelines": pipelines,
        "nodes": nodes,
        "reshard": None if reshard is None else asdict(reshard),
        "healthy": healthy,
    }


def diagnosis(coordinator: Coordinator, config: Config) -> Diagnosis:
    """A `Diagnosis` that reads the leader's `/status`: each of the shard's pipelines that
    does not consume, with its state and error; or why `/status` could not be read."""

    def why(shard: int, node: str) -> str | None:
        endpoints = coordinator.nodes().get(node)
        if endpoints is None:
            return f"{node} is not registered (its session ended)"
        token = config.server.token.value or None
        try:
            view = fetch_json(endpoints.http, "/status", token, client_tls(config))
        except OpsError as exc:
            return f"its /status did not answer: {exc}"
        found = [
            f"pipeline {p['pipeline']}: {state_text(p)}"
            for p in _pipelines_of(shard, node, {node: view}, {})
            if p["state"] != "consuming" or p.get("error") or p.get("waiting")
        ]
        return "; ".join(found) or None

    return why


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
                    "lanes": p.get("lanes", []),
                    "pushed": p.get("pushed"),
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
    `consuming, waiting_for_topic for 35 s: topic clicks does not exist`, `paused by
    ops@host since ...: reason`."""
    if p.get("paused"):
        return pause_text(p["paused"])
    text = str(p["state"])
    if p.get("reflushing"):
        text += f", re-flushing pending {p.get('pending_block')}"
    waits = p.get("waiting") or []
    for wait in waits:
        text += f", {wait['state']} for {wait['for_s']:.0f} s: {wait['detail']}"
    error = UNAUTHORIZED if _unauthorized(p.get("error")) else p.get("error")
    return f"{text}: {error}" if error and not waits else text


def flush_path_text(path: dict[str, Any] | None) -> str | None:
    """`warm`, `starting for 4 s`, `cold`, `failed: <error>` (None: the node did not say)."""
    if path is None:
        return None
    if path["state"] == "starting":
        return f"starting for {path['for_s']:.0f} s"
    if path["state"] == "failed":
        return f"failed: {path['error']}"
    return str(path["state"])


def pause_text(pause: dict[str, Any]) -> str:
    """`paused by ops@host since 2026-11-26 10:00:00Z (35s ago): reason`, and when the
    command that paused it holds it for its own duration, when the leader resumes it."""
    text = f"paused by {pause['by']} since {clock(pause['at'])}: {pause['reason']}"
    if pause.get("deadline"):
        text += f"; the leader resumes it at {until(pause['deadline'])} unless that ends it first"
    return text


def reshard_text(reshard: dict[str, Any]) -> str:
    """The line under the shard table while a reshard is in progress."""
    return (
        f"reshard to {reshard['shard_count']} shards in progress, by {reshard['by']} since "
        f"{clock(reshard['at'])}: leaders drain; they abort it at {until(reshard['deadline'])} "
        "unless it completes (`hakafka reshard --abort` ends it now)"
    )


def lag_by_lane(lag: dict[int, int] | None, lanes: list[list[int]]) -> str | None:
    """`1200 (p0=700 p1=500)`; with several lanes each lane's partitions apart, `|` between
    lanes: `1200 (p0=700 p2=0 | p1=500 p3=0)`."""
    if lag is None:
        return None
    groups = lanes if len(lanes) > 1 else [sorted(lag)]
    return (
        f"{sum(lag.values())} ("
        + " | ".join(" ".join(f"p{k}={lag[k]}" for k in group if k in lag) for group in groups)
        + ")"
    )


def lanes_table(pipelines: list[dict[str, Any]]) -> str | None:
    """One row per consume lane of every pipeline read with more than one (None when none
    is): its partitions, recent rows/s, rows since the pipeline started reading, and lag."""
    rows = []
    for p in pipelines:
        lanes = p.get("lanes") or []
        if len(lanes) < 2:
            continue
        rows += [
            [
                p["shard"],
                p["pipeline"],
                lane["lane"],
                " ".join(f"p{k}" for k in lane["partitions"]),
                f"{lane['rows_per_s']:,.0f}",
                lane["rows"],
                lane["lag"],
            ]
            for lane in lanes
        ]
    if not rows:
        return None
    return format_table(["SHARD", "PIPELINE", "LANE", "PARTITIONS", "ROWS/S", "ROWS", "LAG"], rows)


def pushes_table(pipelines: list[dict[str, Any]]) -> str | None:
    """One row per pipeline that writers push into (None when none does): rows/s, rows
    since the pipeline started reading, writers, batches not yet answered, batches whose
    copies to other nodes are out (the replication lag), and batches a re-flush awaits from
    their writers."""
    rows = [
        [
            p["shard"],
            p["pipeline"],
            f"{pushed['rows_per_s']:,.0f}",
            pushed["rows"],
            pushed["writers"],
            pushed["unanswered"],
            pushed.get("copying", 0),
            pushed["awaiting_retries"],
        ]
        for p in pipelines
        if (pushed := p.get("pushed")) and (pushed["writers"] or pushed["rows"])
    ]
    if not rows:
        return None
    header = [
        "SHARD",
        "PIPELINE",
        "PUSHED ROWS/S",
        "ROWS",
        "WRITERS",
        "UNANSWERED",
        "COPYING",
        "AWAITED",
    ]
    return format_table(header, rows)


def _yes_no(value: object) -> str | None:
    return None if value is None else "yes" if value else "no"


def render(status: dict[str, Any]) -> str:
    """The tables `hakafka status` prints (shards, pipelines, lanes where a pipeline reads
    with several, nodes), and under them what every node's answer had in common (the token
    refused)."""
    shards = format_table(
        ["SHARD", "LEADER", "EPOCH", "STATUS", "SINCE"],
        [
            [
                s["shard"],
                s["leader"],
                s["epoch"],
                s["status"]
                + "".join(f", {name} paused" for name in s.get("paused", []))
                + (
                    f", held on {s['held']['node']} until {until(s['held']['until'])}"
                    if s.get("held")
                    else ""
                ),
                clock(s["since"]),
            ]
            for s in status["shards"]
        ],
    )
    rows = []
    for p in status["pipelines"]:
        lag_text = lag_by_lane(p.get("lag"), [lane["partitions"] for lane in p.get("lanes") or []])
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
        ["NODE", "ALIVE", "HEALTHY", "LEADS", "FLUSH PATH", "HTTP", "FLIGHT", "REPLACING"],
        [
            [
                n["node"],
                _yes_no(n["alive"]),
                (UNAUTHORIZED if _unauthorized(n["error"]) else n["error"])
                or _yes_no(n["healthy"]),
                n.get("leads"),
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
    if status.get("reshard"):
        shards += "\n" + reshard_text(status["reshard"])
    lanes = lanes_table(status["pipelines"])
    pushes = pushes_table(status["pipelines"])
    text = "\n\n".join(t for t in (shards, pipelines, lanes, pushes, nodes) if t is not None)
    refused = [n["node"] for n in status["nodes"] if _unauthorized(n["error"])]
    if refused:
        text += (
            f"\n\n{', '.join(refused)} refused this command's token (HTTP 401): set [server] "
            f"token_file (or {ENV_SERVER_TOKEN}) in this config to the token the nodes use"
        )
    return text


UNAUTHORIZED = "unauthorized (see below)"


def _unauthorized(error: str | None) -> bool:
    return error is not None and "HTTP 401" in error
