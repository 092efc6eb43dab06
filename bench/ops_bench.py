"""What the operator's tools cost a running cluster (#25), under load, next to the hand-over
operators already accept.

One cluster of two nodes and two shards on the local stack (ZooKeeper, tansu, the ClickHouse
front): n1 leads both shards, n2 stands by; a producer sends `exactly_once_bench.RATE`
messages a second over its partitions throughout. Each operation is timed from its request:

- `hakafka offsets set --to-latest` of shard 0 (pause, wait for the leader's stop, one fenced
  multi-op, resume): the command's wall time and the longest gap between checkpoint commits
  of shard 0's partitions around it; beside it shard 1's longest gap (it must not stop) and,
  as the baseline, `hakafka failover --shard 0` under the same load (the stop operators already
  accept for a hand-over).
- `systemctl reload` (SIGHUP with a changed flush threshold): from the signal to the
  `config.reloaded` event, and the longest commit gap around it (a reload must not stop
  anything).
- The admin endpoint under load: p50/p99 of `/metrics`, `/status`, `/status/history` and the
  status page `/`, next to `/health` (the floor: the same server answering a constant).

Run: PYTHONPATH=. .venv/bin/python bench/ops_bench.py
"""

from __future__ import annotations

import contextlib
import signal
import statistics
import time
import urllib.request
from collections.abc import Sequence
from datetime import datetime

from benchstack import Bench, local_stack
from e2e_bench import SESSION_TIMEOUT, ZK_ROOT
from exactly_once_bench import (
    BUFFER,
    PARTITIONS,
    RATE,
    SETTLE_TIMEOUT_S,
    WARM_S,
    Load,
    command_seconds,
    commits,
    longest_gap,
    ms,
)

from devstack.chaos.checks import log_events
from devstack.cluster import DaemonNode, LocalCluster, PipelineSpec
from devstack.process import wait_until
from devstack.records import EVENT_COLUMNS, create_topic

NAME = "ops_bench"
SHARD0 = frozenset(p for p in range(PARTITIONS) if p % 2 == 0)
REQUESTS = 100
ENDPOINTS = ("/health", "/metrics", "/status", "/status/history", "/")


def gaps(nodes: Sequence[DaemonNode], since: float, until: float) -> tuple[float, float]:
    """The longest interval between checkpoint commits of shard 0's partitions, and of shard
    1's, from `since` (minus a look-back) to `until` (Unix times)."""
    window = [c for c in commits(nodes) if since - WARM_S <= c.at <= until]
    shard0 = [c.at for c in window if c.partitions & SHARD0]
    shard1 = [c.at for c in window if c.partitions - SHARD0]
    return longest_gap(shard0, "shard 0"), longest_gap(shard1, "shard 1")


def settle(nodes: Sequence[DaemonNode], after: float) -> float:
    """When every partition has been checkpointed after `after` (Unix time)."""
    seen: dict[int, float] = {}

    def all_committed() -> bool:
        for commit in commits(nodes):
            if commit.at > after:
                for p in commit.partitions:
                    seen.setdefault(p, commit.at)
        return len(seen) == PARTITIONS

    wait_until(all_committed, timeout=SETTLE_TIMEOUT_S, what="every partition checkpointed")
    return max(seen.values())


def operation(nodes: Sequence[DaemonNode], *args: str) -> tuple[float, float, float]:
    """`hakafka ARGS` under load: its wall time, shard 0's and shard 1's longest commit gap."""
    time.sleep(WARM_S)
    requested = time.time()
    took = command_seconds(*args)
    done = settle(nodes, requested + took)
    shard0, shard1 = gaps(nodes, requested, done)
    return took, shard0, shard1


def latencies(node: DaemonNode, path: str) -> tuple[float, float]:
    """p50 and p99 seconds of REQUESTS GETs of `path` (with the node's token)."""
    samples = []
    for _ in range(REQUESTS):
        request = urllib.request.Request(
            f"{node.url}{path}", headers={"Authorization": f"Bearer {node.token}"}
        )
        began = time.perf_counter()
        with urllib.request.urlopen(request, timeout=10) as response:
            response.read()
        samples.append(time.perf_counter() - began)
    samples.sort()
    return statistics.median(samples), samples[int(len(samples) * 0.99) - 1]


def run(bench: Bench) -> list[str]:
    create_topic(bench.stack.kafka, NAME, PARTITIONS)
    bench.ch.client().command(f"CREATE DATABASE IF NOT EXISTS {NAME}")
    cluster = LocalCluster(
        bench.root / NAME,
        bench.stack,
        nodes={"n1": [0, 1], "n2": [0, 1]},
        shard_count=2,
        pipelines=[PipelineSpec("events", NAME, "events", EVENT_COLUMNS, buffer=BUFFER)],
        zk_root=f"{ZK_ROOT}/{NAME}",
        database=NAME,
        session_timeout=SESSION_TIMEOUT,
    )
    first, standby = cluster.nodes["n1"], cluster.nodes["n2"]
    config = str(first.config_path)
    with contextlib.ExitStack() as stack:
        stack.callback(cluster.stop)
        command_seconds("init", "--config", config)
        first.start()
        first.wait_up(90)
        cluster.wait_leaders([0, 1])
        standby.start()
        standby.wait_up(90)
        load = Load(bench.stack.kafka, NAME)
        load.start()
        stack.callback(load.stop)
        nodes = [first, standby]
        settle(nodes, 0)
        move = operation(
            nodes,
            "offsets",
            "set",
            "--config",
            config,
            "--shard",
            "0",
            "--pipeline",
            "events",
            "--to-latest",
        )
        failover = operation(nodes, "failover", "--config", config, "--shard", "0")
        leader = next(n for n in nodes if 1 in n.leads())
        time.sleep(WARM_S)
        text = leader.config_path.read_text()
        leader.config_path.write_text(text.replace("\nmax_age = 2\n", "\nmax_age = 2.5\n", 1))
        signalled = time.time()
        leader.kill(signal.SIGHUP)
        wait_until(
            lambda: bool(log_events(leader.log_path, ["config.reloaded"])),
            timeout=30,
            what="the reload",
        )
        (reloaded,) = log_events(leader.log_path, ["config.reloaded"])
        applied = datetime.fromisoformat(reloaded["timestamp"]).timestamp() - signalled
        done = settle(nodes, signalled + WARM_S)
        reload_gap = max(gaps(nodes, signalled, done))
        endpoint = {path: latencies(leader, path) for path in ENDPOINTS}
        load.stop()
    floor = endpoint["/health"][0]
    lines = [
        f"cluster: 2 nodes, 2 shards, {PARTITIONS} partitions, load {RATE:,} messages/s "
        f"(achieved {load.rate():,.0f}); flush every >= {BUFFER['min_rows']:,} rows / "
        f"{BUFFER['max_age']} s; gaps: longest interval between checkpoint commits",
        f"  {'operation':<32} {'command':>9} {'shard 0 gap':>12} {'shard 1 gap':>12}",
    ]
    for label, (took, gap0, gap1) in (
        ("offsets set --to-latest (shard 0)", move),
        ("failover --shard 0 (baseline)", failover),
    ):
        lines.append(f"  {label:<32} {ms(took):>9} {ms(gap0):>12} {ms(gap1):>12}")
    lines += [
        f"  offsets set stop / failover stop: {move[1] / failover[1]:.2f}x",
        f"reload (SIGHUP, a changed max_age): applied {ms(applied)} after the signal; "
        f"longest commit gap around it {ms(reload_gap)}",
        f"admin endpoint under load, {REQUESTS} GETs each (p50 / p99, ratio of p50 to /health):",
    ]
    for path, (p50, p99) in endpoint.items():
        lines.append(f"  {path:<16} {ms(p50):>9} {ms(p99):>9} {p50 / floor:>7.1f}x")
    return lines


def main() -> None:
    with local_stack("ops_bench") as bench:
        print("\n".join(run(bench)))


if __name__ == "__main__":
    main()
