"""Leader failover: time from leader loss to a new leader, for a clean resign, an ops failover
request and kill -9 of the leader process, over 20 rounds each, on a local 3-member ZooKeeper
ensemble, printed next to the configured session timeout and a raw baseline from the same run
(one znode deletion seen by another client's watch: the floor for any hand-over).

Clean resign: from `Leadership.resign()` to the successor's BecameLeader.
Ops failover: from `request_failover()` to the successor's BecameLeader (the leader hears the
request, resigns, the next candidate takes over). Kill -9: from SIGKILL of the leader process
(tests/coordination/coord_candidate.py) to the successor's became_leader; bounded below by the
session timeout, after which ZooKeeper drops the dead leader's ephemerals.

Run: .venv/bin/python bench/failover_bench.py
"""

from __future__ import annotations

import functools
import importlib.util
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import structlog
from kazoo.client import KazooClient

from devstack.process import wait_until
from devstack.zookeeper import ZooKeeperEnsemble
from hakafka.coordination import (
    BecameLeader,
    Coordinator,
    FailoverRequested,
    Leadership,
    LeadershipEvent,
    NodeInfo,
    ZkConfig,
)

ROUNDS = 20
SESSION_TIMEOUT_S = 2.0
CANDIDATE = Path(__file__).resolve().parents[1] / "tests" / "coordination" / "coord_candidate.py"
NODES = ("n1", "n2", "n3")


def summary(samples: list[float]) -> tuple[float, float]:
    return statistics.median(samples), max(samples)


def watch_baseline(hosts: str) -> list[float]:
    """Seconds from one client's delete of a znode to another client's watch firing."""
    writer = KazooClient(hosts=hosts, timeout=10.0)
    reader = KazooClient(hosts=hosts, timeout=10.0)
    writer.start(timeout=10)
    reader.start(timeout=10)
    samples = []
    try:
        for i in range(ROUNDS):
            path = f"/bench/baseline/z{i}"
            writer.create(path, b"", makepath=True)
            fired = threading.Event()

            def watching(path: str = path, fired: threading.Event = fired) -> bool:
                return reader.exists(path, lambda _event: fired.set()) is not None

            wait_until(watching, timeout=5, what="reader seeing the znode")
            started = time.time()
            writer.delete(path)
            if not fired.wait(5):
                # A missed watch is not a 5 s sample: it would skew the floor every ratio uses.
                raise RuntimeError(
                    f"baseline round {i + 1}: the reader's watch on {path} did not fire within "
                    "5 s of the delete; the baseline cannot be measured"
                )
            samples.append(time.time() - started)
    finally:
        for client in (writer, reader):
            client.stop()
            client.close()
    return samples


class InProcessCluster:
    """Three coordinators in this process standing in shard 0; records BecameLeader times."""

    def __init__(self, hosts: str, root: str) -> None:
        config = ZkConfig(hosts=hosts, root=root, session_timeout_s=SESSION_TIMEOUT_S)
        self.became: list[tuple[str, float]] = []
        self.coordinators: dict[str, Coordinator] = {}
        self.joined: dict[str, Leadership] = {}
        for node in NODES:
            endpoints = NodeInfo(host="127.0.0.1", http="", flight="", pid=os.getpid(), version="b")
            coordinator = Coordinator(config, node, endpoints)
            coordinator.start()
            coordinator.register()
            self.coordinators[node] = coordinator
            self.joined[node] = coordinator.join(
                0, on_change=functools.partial(self._on_change, node)
            )
        wait_until(lambda: self.leader() is not None, timeout=10, what="a first leader")

    def _on_change(self, node: str, event: LeadershipEvent) -> None:
        if isinstance(event, BecameLeader):
            self.became.append((node, event.at))
        elif isinstance(event, FailoverRequested):
            self.joined[node].resign("ops failover")  # the daemon's reaction, minus the flush

    def leader(self) -> str | None:
        leading = [n for n, lead in self.joined.items() if lead.token is not None]
        return leading[0] if len(leading) == 1 else None

    def successor_after(self, old: str, since: float) -> float:
        found: list[float] = []

        def elected() -> bool:
            found[:] = [at for node, at in list(self.became) if node != old and at >= since]
            return bool(found)

        wait_until(elected, timeout=10, what=f"a leader after {old}", interval=0.001)
        return found[0] - since

    def resign_round(self) -> float:
        old = self.leader()
        assert old is not None
        started = time.time()
        self.joined[old].resign("bench")
        return self.successor_after(old, started)

    def failover_round(self) -> float:
        old = self.leader()
        assert old is not None
        wait_until(
            lambda: self.coordinators[old].leader_of(0) is not None,
            timeout=5,
            what="leader znode visible",
        )
        started = time.time()
        self.coordinators[NODES[0]].request_failover(0, by="bench")
        took = self.successor_after(old, started)
        wait_until(lambda: self.leader() is not None, timeout=5, what="settled")
        return took

    def close(self) -> None:
        for coordinator in self.coordinators.values():
            coordinator.close()


def candidate_process_class() -> Any:
    """`CandidateProcess` from the tests' candidate program (the same one the tests run)."""
    spec = importlib.util.spec_from_file_location("coord_candidate", CANDIDATE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.CandidateProcess


def kill9_rounds(hosts: str, root: str) -> list[float]:
    process_class = candidate_process_class()

    def spawn(node: str) -> Any:
        proc = process_class(hosts, root, node, 0, SESSION_TIMEOUT_S)
        proc.wait_event("ready", 30)
        return proc

    procs = [spawn(node) for node in NODES]
    samples = []
    try:
        for i in range(ROUNDS):
            leading: list[Any] = []

            def elected(since: float = 0.0, leading: list[Any] = leading) -> bool:
                leading[:] = [p for p in procs if p.became_after(since) is not None]
                return bool(leading)

            wait_until(elected, timeout=10, what="a leader")
            leader = leading[0]
            leader.stop()  # SIGKILL by PID
            killed = time.time()
            procs.remove(leader)
            wait_until(
                functools.partial(elected, killed),
                timeout=SESSION_TIMEOUT_S + 10,
                what="a new leader",
                interval=0.005,
            )
            samples.append(min(p.became_after(killed) for p in leading) - killed)
            procs.append(spawn(f"r{i}"))
    finally:
        for proc in procs:
            proc.stop()
    return samples


def main() -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    with tempfile.TemporaryDirectory(prefix="failover-bench-") as tmp:
        ensemble = ZooKeeperEnsemble(Path(tmp) / "zk", members=3)
        ensemble.start()
        try:
            ensemble.wait_settled()
            baseline = watch_baseline(ensemble.hosts)
            cluster = InProcessCluster(ensemble.hosts, "/bench/inprocess")
            try:
                resign = [cluster.resign_round() for _ in range(ROUNDS)]
                ops = [cluster.failover_round() for _ in range(ROUNDS)]
            finally:
                cluster.close()
            kill9 = kill9_rounds(ensemble.hosts, "/bench/processes")
        finally:
            ensemble.stop()
    base_median, base_max = summary(baseline)
    print(
        f"failover bench: 3-member ZooKeeper ensemble on 127.0.0.1, {ROUNDS} rounds each, "
        f"session timeout {SESSION_TIMEOUT_S:.1f} s"
    )
    print(
        f"raw baseline (znode delete -> another client's watch fires): "
        f"median {base_median * 1000:.1f} ms, max {base_max * 1000:.1f} ms"
    )
    print(
        f"{'scenario':<14}{'median ms':>11}{'max ms':>10}{'median/baseline':>17}"
        f"{'max/session timeout':>21}"
    )
    for name, samples in (("clean resign", resign), ("ops failover", ops), ("kill -9", kill9)):
        median, worst = summary(samples)
        print(
            f"{name:<14}{median * 1000:>11.1f}{worst * 1000:>10.1f}"
            f"{median / base_median:>16.1f}x{worst / SESSION_TIMEOUT_S:>20.2f}x"
        )


if __name__ == "__main__":
    main()
