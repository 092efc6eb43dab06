"""The local stack the benches that run real daemons share: ZooKeeper (one member), the tansu
broker and the ClickHouse front, started under a fresh temporary folder and stopped by PID.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from kazoo.client import KazooClient

from devstack.clickhouse import ClickHouseService
from devstack.cluster import StackEndpoints
from devstack.kafka import KafkaBroker
from devstack.zookeeper import ZooKeeperEnsemble


@dataclass(frozen=True)
class Bench:
    """What every step shares: a folder for the steps' files, the stack's endpoints, its
    ClickHouse, and its processes by name (the CPU meters read them next to the daemon)."""

    root: Path
    stack: StackEndpoints
    ch: ClickHouseService
    pids: dict[str, int]


@contextlib.contextmanager
def local_stack(prefix: str) -> Iterator[Bench]:
    """The stack started under a new folder `/tmp/<prefix>…`; stopped on leaving, also when
    starting it failed half way."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    zk, broker, ch = (
        ZooKeeperEnsemble(root / "zk"),
        KafkaBroker(root / "kafka"),
        ClickHouseService(root / "ch"),
    )
    try:
        for service in (zk, broker, ch):
            service.start()
        stack_pids = {
            name: pid for name, pid in (("broker", broker.pid), ("ClickHouse", ch.pid)) if pid
        }
        yield Bench(
            root, StackEndpoints(zk.hosts, broker.bootstrap, f"127.0.0.1:{ch.port}"), ch, stack_pids
        )
    finally:
        for service in (ch, broker, zk):
            service.stop()


class ZkView:
    """A ZooKeeper session of the bench's own, chrooted at a cluster's root; `close` ends it."""

    def __init__(self, hosts: str, root: str) -> None:
        self.client = KazooClient(hosts=f"{hosts}{root}", timeout=10.0)
        self.client.start(timeout=15)

    def close(self) -> None:
        self.client.stop()
        self.client.close()
