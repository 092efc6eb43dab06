"""The whole local stack as one unit: `python -m devstack up|down|status`.

`up` starts ZooKeeper, the tansu broker, the ClickHouse front and the schema registry
(`devstack.schema_registry`) in the background, waits
until each is healthy, and records what it started in `<root>/stack.json` (PIDs, command
lines, endpoints) and `<root>/stack.env` (endpoints as shell variables); if any service fails,
it stops everything it started before reporting the error. `down` stops exactly those PIDs,
and only while each still runs the recorded command line. `start_spark` (`up --spark MODE`)
adds a Spark standalone cluster or a Spark Connect server to a running stack, recorded alike.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from devstack.clickhouse import ClickHouseService
from devstack.kafka import KafkaBroker, broker_healthy
from devstack.process import DevstackError, pid_alive, pid_cmdline, stop_pid
from devstack.schema_registry import SchemaRegistryService, registry_healthy
from devstack.spark_cluster import SPARK_HEALTH, SPARK_SERVICE, start_spark
from devstack.zookeeper import ZooKeeperEnsemble, server_mode

STATE_FILE = "stack.json"
ENV_FILE = "stack.env"


@dataclass(frozen=True)
class ServiceRecord:
    """What `up` started: enough for `down` and `status` in another process."""

    name: str
    pid: int
    cmdline: str
    endpoint: str
    env_var: str


@dataclass(frozen=True)
class ServiceStatus:
    name: str
    pid: int
    endpoint: str
    running: bool
    healthy: bool


def _record(name: str, pid: int | None, endpoint: str, env_var: str) -> ServiceRecord:
    if pid is None:
        raise DevstackError(f"{name} reported no PID after start")
    return ServiceRecord(name, pid, " ".join(pid_cmdline(pid)), endpoint, env_var)


def _zk_healthy(endpoint: str) -> bool:
    return all(server_mode(int(hp.rsplit(":", 1)[1])) for hp in endpoint.split(","))


def _ch_healthy(endpoint: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(f"{endpoint}/ping", timeout=1.0) as resp:
            return bool(resp.read() == b"Ok.\n")
    except OSError:
        return False


def _kafka_healthy(endpoint: str) -> bool:
    try:
        return broker_healthy(endpoint)
    except Exception:
        return False


_HEALTH: dict[str, Callable[[str], bool]] = {
    "zookeeper": _zk_healthy,
    "kafka": _kafka_healthy,
    "clickhouse": _ch_healthy,
    "clickhouse2": _ch_healthy,
    "schema_registry": registry_healthy,
    **SPARK_HEALTH,
}


class DevStack:
    """The local stack rooted at one directory."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()

    @property
    def state_path(self) -> Path:
        return self.root / STATE_FILE

    @property
    def env_path(self) -> Path:
        return self.root / ENV_FILE

    def records(self) -> list[ServiceRecord]:
        """The services recorded by the last `up`, or [] if none."""
        if not self.state_path.exists():
            return []
        raw = json.loads(self.state_path.read_text())
        return [ServiceRecord(**item) for item in raw["services"]]

    def up(
        self, *, zk_members: int = 1, clickhouse_servers: int = 1, timeout: float = 30.0
    ) -> list[ServiceRecord]:
        """Start the stack unless it runs already; return what runs. `clickhouse_servers` = 2
        adds a second ClickHouse front (`clickhouse2`, its own chdb data path): two shards.

        Each service must be healthy within `timeout` s. If any step fails (or is interrupted),
        every process this call started is stopped by PID, nothing is recorded, and the error
        propagates.
        """
        recorded = self.records()
        running = [r for r in recorded if _owned(r)]
        if running:
            if len(running) == len(recorded):
                return running
            raise DevstackError(
                f"part of a stack still runs from {self.state_path}: "
                "run `python -m devstack down` first"
            )
        self.root.mkdir(parents=True, exist_ok=True)
        zk = ZooKeeperEnsemble(self.root / "zookeeper", members=zk_members)
        broker = KafkaBroker(self.root / "kafka")
        ch = ClickHouseService(self.root / "clickhouse")
        ch2 = ClickHouseService(self.root / "clickhouse2") if clickhouse_servers > 1 else None
        registry = SchemaRegistryService(self.root / "schema_registry")
        try:
            zk.start(timeout=timeout)
            broker.start(timeout=timeout)
            ch.start(timeout=timeout)
            if ch2 is not None:
                ch2.start(timeout=timeout)
            registry.start(timeout=timeout)
            started = [
                _record("zookeeper", m.pid, f"127.0.0.1:{m.client_port}", "HAKAFKA_ZK_HOSTS")
                for m in zk.members
            ]
            started.append(
                _record("kafka", broker.pid, broker.bootstrap, "HAKAFKA_KAFKA_BOOTSTRAP")
            )
            started.append(_record("clickhouse", ch.pid, ch.url, "HAKAFKA_CLICKHOUSE_URL"))
            if ch2 is not None:
                started.append(_record("clickhouse2", ch2.pid, ch2.url, "HAKAFKA_CLICKHOUSE2_URL"))
            started.append(
                _record(
                    "schema_registry", registry.pid, registry.url, "HAKAFKA_SCHEMA_REGISTRY_URL"
                )
            )
            self._save(started)
        except BaseException:
            # Reverse start order; stopping a service that never started is a no-op.
            for service in (registry, ch2, ch, broker, zk):
                if service is None:
                    continue
                # Attempt every stop: the start error is the one the user must see.
                with contextlib.suppress(Exception):
                    service.stop()
            raise
        return started

    def _save(self, records: list[ServiceRecord]) -> None:
        state = {"started": time.time(), "services": [asdict(r) for r in records]}
        self.state_path.write_text(json.dumps(state, indent=2) + "\n")
        env: dict[str, list[str]] = {}
        for r in records:
            env.setdefault(r.env_var, []).append(r.endpoint)
        self.env_path.write_text(
            "".join(f"{var}={','.join(values)}\n" for var, values in env.items())
        )

    def start_spark(self, modes: Sequence[str], *, timeout: float = 90.0) -> list[ServiceRecord]:
        """Add the Spark services of `modes` ("standalone": a master and a worker, "connect":
        a Spark Connect server) to the running stack, recorded with it so that `status` and
        `down` see them; a mode already recorded is not started again. Returns the records of
        every Spark service of the stack."""
        recorded = self.records()
        if not recorded:
            raise DevstackError(f"no stack recorded in {self.state_path}: run `up` first")
        names = {r.name for r in recorded}
        new = [mode for mode in dict.fromkeys(modes) if SPARK_SERVICE[mode] not in names]
        started = [_record(*service) for service in start_spark(self.root, new, timeout=timeout)]
        self._save([*recorded, *started])
        return [r for r in self.records() if r.name in SPARK_HEALTH]

    def down(self) -> list[ServiceRecord]:
        """Stop every recorded service by PID; return those that were stopped."""
        stopped = [r for r in reversed(self.records()) if stop_pid(r.pid, marker=r.cmdline)]
        self.state_path.unlink(missing_ok=True)
        self.env_path.unlink(missing_ok=True)
        return stopped

    def status(self) -> list[ServiceStatus]:
        """Each recorded service: whether its PID runs and whether it answers health checks."""
        statuses = []
        for r in self.records():
            running = _owned(r)
            healthy = running and _HEALTH[r.name](r.endpoint)
            statuses.append(ServiceStatus(r.name, r.pid, r.endpoint, running, healthy))
        return statuses


def _owned(record: ServiceRecord) -> bool:
    """True if the recorded PID still runs the recorded command line."""
    return pid_alive(record.pid) and " ".join(pid_cmdline(record.pid)) == record.cmdline
