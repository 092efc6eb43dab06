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
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import structlog
from kazoo.client import KazooClient

from hakafka.coordination import (
    BecameLeader,
    Coordinator,
    FailoverRequested,
    Leadership,
    LeadershipEvent,
    NodeInfo,
    ZkConfig,
)
from hakafka.devstack.process import wait_until
from hakafka.devstack.zookeeper import ZooKeeperEnsemble

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
            fired.wait(5)
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


class CandidateProcess:
    """coord_candidate.py as a child; its became_leader times."""

    def __init__(self, hosts: str, root: str, node: str) -> None:
        self.node = node
        self.became: list[float] = []
        self.ready = threading.Event()
        self.popen = subprocess.Popen(
            [
                sys.executable,
                str(CANDIDATE),
                "--hosts",
                hosts,
                "--root",
                root,
                "--node",
                node,
                "--session-timeout",
                str(SESSION_TIMEOUT_S),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        threading.Thread(target=self._read, daemon=True).start()
        if not self.ready.wait(30):
            raise RuntimeError(f"candidate {node} did not start")

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            if line.startswith("{"):
                event = json.loads(line)
                if event["event"] == "ready":
                    self.ready.set()
                elif event["event"] == "became_leader":
                    self.became.append(event["at"])

    def leading(self) -> bool:
        return bool(self.became) and self.popen.poll() is None

    def kill(self) -> None:
        if self.popen.poll() is None:
            os.kill(self.popen.pid, signal.SIGKILL)
        self.popen.wait(timeout=10)


def kill9_rounds(hosts: str, root: str) -> list[float]:
    procs = [CandidateProcess(hosts, root, node) for node in NODES]
    samples = []
    try:
        wait_until(lambda: any(p.leading() for p in procs), timeout=10, what="a first leader")
        for i in range(ROUNDS):
            leader = next(p for p in procs if p.leading())
            leader.kill()
            killed = time.time()
            procs.remove(leader)
            found: list[float] = []

            def elected(since: float = killed, found: list[float] = found) -> bool:
                found[:] = [at for p in procs for at in p.became if at >= since]
                return bool(found)

            wait_until(elected, timeout=SESSION_TIMEOUT_S + 10, what="a new leader", interval=0.005)
            samples.append(found[0] - killed)
            procs.append(CandidateProcess(hosts, root, f"r{i}"))
    finally:
        for proc in procs:
            proc.kill()
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
