"""Fixtures and helpers for the coordination tests: coordinators against the real 3-member
ensemble, candidate processes, and the leadership log that checks "one leader at a time"."""

from __future__ import annotations

import importlib.util
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from kazoo.client import KazooClient
from kazoo.recipe.watchers import DataWatch

from hakafka.coordination import (
    BecameLeader,
    Coordinator,
    LeadershipEvent,
    LostLeadership,
    NodeInfo,
    Resumed,
    Suspended,
    ZkConfig,
)
from hakafka.devstack.zookeeper import ZooKeeperEnsemble

CANDIDATE = Path(__file__).with_name("coord_candidate.py")
SESSION_TIMEOUT_S = 2.0


@dataclass
class LeadershipLog:
    """Every node's leadership intervals, from the times the nodes report for their own
    state changes; `assert_one_leader` fails if two nodes' intervals overlap."""

    events: list[tuple[float, str, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, node: str, kind: str, at: float) -> None:
        with self.lock:
            self.events.append((at, node, kind))

    def callback(self, node: str) -> Callable[[LeadershipEvent], None]:
        def on_change(event: LeadershipEvent) -> None:
            if isinstance(event, (BecameLeader, Resumed)):
                self.record(node, "start", event.at)
            elif isinstance(event, (LostLeadership, Suspended)):
                self.record(node, "end", event.at)

        return on_change

    def feed(self, node: str, events: list[dict[str, Any]]) -> None:
        """Record a candidate process's reported leadership changes (its JSON events)."""
        for event in events:
            if event["event"] in ("became_leader", "resumed"):
                self.record(node, "start", event["at"])
            elif event["event"] in ("lost", "suspended"):
                self.record(node, "end", event["at"])

    def intervals(self, until: float | None = None) -> list[tuple[float, float, str]]:
        end_of_time = time.time() if until is None else until
        opened: dict[str, float] = {}
        spans: list[tuple[float, float, str]] = []
        with self.lock:
            events = sorted(self.events)
        for at, node, kind in events:
            if kind == "start":
                opened.setdefault(node, at)
            elif node in opened:
                spans.append((opened.pop(node), at, node))
        spans += [(start, end_of_time, node) for node, start in opened.items()]
        return sorted(spans)

    def leaders(self) -> list[str]:
        return [node for _, _, node in self.intervals()]

    def assert_one_leader(self) -> None:
        latest_end, latest = 0.0, ""
        for start, end, node in self.intervals():
            assert start >= latest_end, (
                f"{latest} led until {latest_end:.3f} and {node} from {start:.3f}: overlap"
            )
            if end > latest_end:
                latest_end, latest = end, node


def _candidate_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("coord_candidate", CANDIDATE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class LeaderWatcher:
    """A separate kazoo client that records every change of `shards/<s>/leader` it sees:
    (unix time, node or None, epoch or None)."""

    def __init__(self, hosts: str, root: str, shard: int = 0) -> None:
        self.client = KazooClient(hosts=hosts, timeout=10.0)
        self.client.start(timeout=10)
        self.client.ensure_path(f"{root}/shards/{shard}")
        self.seen: list[tuple[float, str | None, int | None]] = []
        DataWatch(self.client, f"{root}/shards/{shard}/leader", self._changed)

    def _changed(self, data: bytes | None, _stat: Any) -> None:
        if data is None:
            self.seen.append((time.time(), None, None))
        else:
            value = json.loads(data)
            self.seen.append((time.time(), value["node"], value["epoch"]))

    def current(self) -> str | None:
        return self.seen[-1][1] if self.seen else None

    def assert_epochs_increase(self) -> None:
        epochs = [epoch for _, _, epoch in self.seen if epoch is not None]
        assert epochs == sorted(set(epochs)), f"leader epochs not strictly increasing: {epochs}"

    def close(self) -> None:
        self.client.stop()
        self.client.close()


@pytest.fixture
def leader_watcher(zookeeper_ensemble: ZooKeeperEnsemble, zk_root: str) -> Iterator[LeaderWatcher]:
    watcher = LeaderWatcher(zookeeper_ensemble.hosts, zk_root)
    try:
        yield watcher
    finally:
        watcher.close()


class CoordinatorFactory:
    """Makes started coordinators for this test's root; closes them all at teardown."""

    def __init__(self, hosts: str, root: str) -> None:
        self.hosts = hosts
        self.root = root
        self.made: list[Coordinator] = []

    def config(self, **overrides: Any) -> ZkConfig:
        values: dict[str, Any] = {
            "hosts": self.hosts,
            "root": self.root,
            "session_timeout_s": SESSION_TIMEOUT_S,
            "request_timeout_s": 2.0,
            "connect_timeout_s": 10.0,
        }
        values.update(overrides)
        return ZkConfig(**values)

    def __call__(self, node: str, *, register: bool = True, **overrides: Any) -> Coordinator:
        endpoints = NodeInfo(
            host="127.0.0.1",
            http=f"http://127.0.0.1:1/{node}",
            flight="",
            pid=os.getpid(),
            version="test",
        )
        coordinator = Coordinator(self.config(**overrides), node, endpoints)
        coordinator.start()
        self.made.append(coordinator)
        if register:
            coordinator.register()
        return coordinator

    def close(self) -> None:
        for coordinator in reversed(self.made):
            coordinator.close()


@pytest.fixture
def coordinators(
    zookeeper_ensemble: ZooKeeperEnsemble, zk_root: str
) -> Iterator[CoordinatorFactory]:
    factory = CoordinatorFactory(zookeeper_ensemble.hosts, zk_root)
    try:
        yield factory
    finally:
        factory.close()


@pytest.fixture
def candidates(zookeeper_ensemble: ZooKeeperEnsemble, zk_root: str) -> Iterator[Callable[..., Any]]:
    """start(node, shard=0): a started coord_candidate.py process (CandidateProcess)."""
    started: list[Any] = []
    process_class = _candidate_module().CandidateProcess

    def start(node: str, shard: int = 0) -> Any:
        proc = process_class(zookeeper_ensemble.hosts, zk_root, node, shard, SESSION_TIMEOUT_S)
        started.append(proc)
        proc.wait_event("ready", 20)
        return proc

    try:
        yield start
    finally:
        for proc in started:
            proc.stop()


@pytest.fixture
def leadership_log() -> LeadershipLog:
    return LeadershipLog()
