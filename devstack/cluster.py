"""A local hakafka cluster: config files and `hakafka run` processes on the local stack.

Used by the integration and chaos tests and by `make demo`. Every daemon is a real
process with its own data dir, ports and log file, started and stopped by PID.
"""

from __future__ import annotations

import functools
import json
import signal
import ssl
import sys
import tomllib
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devstack.process import LOOPBACK, ManagedProcess, free_port, wait_until
from devstack.tcp_forward import TcpForwarder


@dataclass(frozen=True)
class PipelineSpec:
    """One `[[pipelines]]` table of the generated configs."""

    name: str
    topic: str
    table: str
    columns: Mapping[str, str]
    buffer: Mapping[str, int | float] = field(default_factory=dict)
    on_error: str = "dead_letter"
    fsync: str = "batch"
    transform: str = ""
    lanes: int | str = "auto"
    push_acks: int = 1


@dataclass(frozen=True)
class StackEndpoints:
    zookeeper: str
    kafka: str
    clickhouse: str  # host:port of the ClickHouse HTTP front
    # host:port of the front of each shard by number, when shards have their own servers.
    clickhouse_shards: tuple[str, ...] = ()

    def clickhouse_of(self, shard: int) -> str:
        """The ClickHouse front serving `shard`: its own server if listed, else the one."""
        return (
            self.clickhouse_shards[shard]
            if shard < len(self.clickhouse_shards)
            else self.clickhouse
        )


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return json.dumps(str(value))


BALANCE_OFF = {"enabled": False}


def render_config(
    *,
    node: str,
    shards: Sequence[int],
    shard_count: int,
    data_dir: Path,
    stack: StackEndpoints,
    zk_root: str,
    replicas: Mapping[int, Mapping[str, str]],
    http_port: int,
    flight_port: int,
    pipelines: Sequence[PipelineSpec],
    session_timeout: float = 4.0,
    database: str = "default",
    spark_conf: Mapping[str, str] | None = None,
    rows_per_task: int = 500_000,
    spark_on_followers: bool = False,
    server: Mapping[str, Any] | None = None,
    spark: Mapping[str, Any] | None = None,
    zookeeper: Mapping[str, Any] | None = None,
    zookeeper_hosts: str | None = None,
    balance: Mapping[str, Any] | None = None,
) -> str:
    """The TOML text of one node's config; `server`, `spark`, `zookeeper` and `balance` add
    keys to (or replace them in) its `[server]`, `[spark]`, `[zookeeper]` and `[balance]`
    tables; `zookeeper_hosts` replaces the stack's connect string (a node behind its own
    proxy)."""
    lines = [
        f"node = {_toml_value(node)}",
        f"shards = {_toml_value(list(shards))}",
        f"shard_count = {shard_count}",
        f"data_dir = {_toml_value(str(data_dir))}",
        "",
        "[zookeeper]",
        f"hosts = {_toml_value(zookeeper_hosts or stack.zookeeper)}",
        f"root = {_toml_value(zk_root)}",
        f"session_timeout = {session_timeout}",
        *(f"{k} = {_toml_value(v)}" for k, v in (zookeeper or {}).items()),
        "",
        "[kafka]",
        f"bootstrap = {_toml_value(stack.kafka)}",
        "",
        "[clickhouse]",
        f"database = {_toml_value(database)}",
    ]
    for shard, nodes in sorted(replicas.items()):
        lines += ["", f"[clickhouse.replicas.{shard}]"]
        lines += [f"{_toml_value(n)} = {_toml_value(ep)}" for n, ep in sorted(nodes.items())]
    lines += [
        "",
        "[spark]",
    ]
    spark_keys = {"master": "local[2]", "driver_memory": "1g", **(spark or {})}
    lines += [f"{k} = {_toml_value(v)}" for k, v in spark_keys.items()]
    lines += [
        f"rows_per_task = {rows_per_task}",
        f"on_followers = {_toml_value(spark_on_followers)}",
    ]
    if spark_conf:
        lines += ["", "[spark.conf]"] + [
            f"{_toml_value(k)} = {_toml_value(v)}" for k, v in spark_conf.items()
        ]
    lines += [
        "",
        "[server]",
        f'http = "{LOOPBACK}:{http_port}"',
        f'flight = "{LOOPBACK}:{flight_port}"',
    ]
    lines += [f"{k} = {_toml_value(v)}" for k, v in (server or {}).items()]
    if balance:
        lines += ["", "[balance]", *(f"{k} = {_toml_value(v)}" for k, v in balance.items())]
    for p in pipelines:
        lines += [
            "",
            "[[pipelines]]",
            f"name = {_toml_value(p.name)}",
            f"topic = {_toml_value(p.topic)}",
            f"table = {_toml_value(p.table)}",
            f"on_error = {_toml_value(p.on_error)}",
            f"transform = {_toml_value(p.transform)}",
            f"lanes = {_toml_value(p.lanes)}",
            f"push_acks = {_toml_value(p.push_acks)}",
            "[pipelines.columns]",
        ]
        lines += [f"{name} = {_toml_value(ch_type)}" for name, ch_type in p.columns.items()]
        if p.buffer:
            lines += ["[pipelines.buffer]"] + [
                f"{k} = {_toml_value(v)}" for k, v in p.buffer.items()
            ]
        lines += ["[pipelines.wal]", f"fsync = {_toml_value(p.fsync)}"]
    return "\n".join(lines) + "\n"


class DaemonNode:
    """One `hakafka run` process of the local cluster; `token` is its admin bearer token;
    with `ca_file` its servers speak TLS and are verified against that CA."""

    def __init__(
        self,
        name: str,
        root: Path,
        config_text: str,
        http_port: int,
        flight_port: int,
        *,
        token: str = "",
        ca_file: str = "",
    ) -> None:
        self.name = name
        self.token = token
        self.ca_file = ca_file
        self.root = root
        self.http_port = http_port
        self.flight_port = flight_port
        self.config_path = root / f"{name}.toml"
        root.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(config_text)
        self.log_path = root / f"{name}.log"
        self.process: ManagedProcess | None = None

    @property
    def url(self) -> str:
        return f"{'https' if self.ca_file else 'http'}://{LOOPBACK}:{self.http_port}"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def start(self, env: Mapping[str, str] | None = None, args: Sequence[str] = ()) -> None:
        """Start the daemon (a new process each time) without waiting for it; `args` are
        added to `hakafka run` (e.g. `--log-file PATH`)."""
        run = [sys.executable, "-m", "hakafka.cli", "run", "--config", str(self.config_path)]
        self.process = ManagedProcess(
            name=f"hakafka daemon {self.name}",
            argv=[*run, *args],
            log_path=self.log_path,
            marker=str(self.config_path),
            env={"ARROW_DEFAULT_MEMORY_POOL": "jemalloc", **(env or {})},
        )
        self.process.start()

    def wait_up(self, timeout: float = 60.0) -> None:
        """Wait until the admin endpoint answers /health and the daemon finished starting
        (registered, its shard runners running): /health answers from the moment the HTTP
        server runs, before that."""
        assert self.process is not None
        self.process.wait_ready(
            lambda: self.get("/health")[0] == 200 and self.started(), timeout=timeout
        )

    def started(self) -> bool:
        """True once `/ready` no longer names a shard runner that is not started yet."""
        code, body = self.get("/ready")
        return code == 200 or b"not started yet" not in body

    def alive(self) -> bool:
        return self.process is not None and self.process.alive()

    def configured_shards(self) -> list[int]:
        """The `shards = [...]` of the node's config file as it is now (a reshard rewrites
        it)."""
        return [int(s) for s in tomllib.loads(self.config_path.read_text())["shards"]]

    def wait_exit(self, timeout: float) -> int:
        """Wait up to `timeout` s for the process to end (else `subprocess.TimeoutExpired`);
        its exit code, -N if signal N killed it."""
        assert self.process is not None and self.process.popen is not None
        return self.process.popen.wait(timeout=timeout)

    def stop(self, timeout: float = 60.0) -> None:
        """SIGTERM and wait (SIGKILL after `timeout`)."""
        if self.process is not None:
            self.process.stop(timeout=timeout)

    def kill(self, sig: signal.Signals = signal.SIGKILL) -> None:
        """Send `sig` (SIGKILL: crash; SIGSTOP/SIGCONT: freeze/thaw); reaps after SIGKILL."""
        if self.process is None:
            return
        self.process.kill(sig)
        if sig == signal.SIGKILL:
            self.process.stop(timeout=5.0)

    def get(self, path: str, timeout: float = 5.0, token: str | None = None) -> tuple[int, bytes]:
        """GET an admin path with the node's token (or `token`; "" sends none)."""
        bearer = self.token if token is None else token
        headers = {"Authorization": f"Bearer {bearer}"} if bearer else {}
        request = urllib.request.Request(f"{self.url}{path}", headers=headers)
        context = ssl.create_default_context(cafile=self.ca_file) if self.ca_file else None
        try:
            with urllib.request.urlopen(request, timeout=timeout, context=context) as resp:
                return int(resp.status), bytes(resp.read())
        except urllib.error.HTTPError as exc:
            return int(exc.code), bytes(exc.read())
        except OSError:
            return 0, b""

    def status(self) -> dict[str, Any]:
        code, body = self.get("/status")
        if code != 200:
            return {}
        result: dict[str, Any] = json.loads(body)
        return result

    def leads(self) -> list[int]:
        """The shards this node leads with every pipeline consuming."""
        return [
            s["shard"]
            for s in self.status().get("shards", [])
            if s["role"] == "leader"
            and s["pipelines"]
            and all(p["state"] == "consuming" for p in s["pipelines"])
        ]

    def flush_path_warm(self) -> bool:
        """Whether the node says its flush path (Spark session, Python workers) is warm."""
        return bool(self.status().get("flush_path", {}).get("state") == "warm")

    def pipelines(self) -> list[dict[str, Any]]:
        """Every pipeline of every shard this node runs, as its `/status` reports them."""
        return [p for s in self.status().get("shards", []) for p in s.get("pipelines", [])]

    def log_tail(self, lines: int = 40) -> str:
        return self.process.log_tail(lines) if self.process is not None else ""


class LocalCluster:
    """Daemons that each serve some shards, sharing one ZooKeeper root and one ClickHouse (or
    one per shard: `StackEndpoints.clickhouse_shards`).
    `rows_per_task` is one value for every node or one per node (node name -> value).

    With `replica_per_node`, each node reaches ClickHouse through its own address, a TCP
    forwarder to the shared server that stands for the node's own replica: the production
    layout, where a node's failure takes its replica with it (`kill_replica`). chdb cannot
    replicate (no ZooKeeper), so the replicas of a shard are one server at several addresses:
    MergeTree accepts that (its tables show one UUID through every address)."""

    def __init__(
        self,
        root: Path,
        stack: StackEndpoints,
        *,
        nodes: Mapping[str, Sequence[int]],
        shard_count: int,
        pipelines: Sequence[PipelineSpec],
        zk_root: str,
        database: str = "default",
        session_timeout: float = 4.0,
        rows_per_task: int | Mapping[str, int] = 500_000,
        spark_on_followers: bool = False,
        server: Mapping[str, Any] | None = None,
        spark: Mapping[str, Any] | None = None,
        zookeeper: Mapping[str, Any] | None = None,
        zookeeper_hosts: Mapping[str, str] | None = None,
        replica_per_node: bool = False,
        session_timeouts: Mapping[str, float] | None = None,
        balance: Mapping[str, Any] | None = None,
    ) -> None:
        """`zookeeper` adds keys to every node's `[zookeeper]`; `zookeeper_hosts` gives a
        node its own connect string (node -> hosts, e.g. a fault-injecting proxy);
        `session_timeouts` gives a node its own session timeout (node -> seconds); `balance`
        is every node's `[balance]` (default off: a shard's first node up leads it)."""
        self.root = root
        self.stack = stack
        self._replica_per_node = replica_per_node
        # (node, the server's host:port) -> the node's own address of that server.
        self._replicas: dict[tuple[str, str], TcpForwarder] = {}
        self._zookeeper_hosts = dict(zookeeper_hosts or {})
        if isinstance(rows_per_task, Mapping):
            if missing := sorted(set(nodes) - set(rows_per_task)):
                raise ValueError(f"rows_per_task names no value for nodes {missing}")
            per_node = dict(rows_per_task)
        else:
            per_node = dict.fromkeys(nodes, rows_per_task)
        self._render = functools.partial(
            render_config,
            stack=stack,
            zk_root=zk_root,
            pipelines=pipelines,
            database=database,
            spark_on_followers=spark_on_followers,
            server=server,
            spark=spark,
            zookeeper=zookeeper,
            # Off unless asked: most tests choose each shard's leader by start order.
            balance=BALANCE_OFF if balance is None else balance,
        )
        self._rows_per_task = per_node
        self._session_timeouts = {
            n: (session_timeouts or {}).get(n, session_timeout) for n in nodes
        }
        self._ports = {node: (free_port(), free_port()) for node in nodes}
        texts = self.layout_configs(nodes, shard_count)
        token = str((server or {}).get("token", ""))
        ca_file = str((server or {}).get("tls_ca_file", ""))
        self.nodes: dict[str, DaemonNode] = {
            node: DaemonNode(
                node, root, texts[node], *self._ports[node], token=token, ca_file=ca_file
            )
            for node in nodes
        }

    def layout_configs(
        self, nodes: Mapping[str, Sequence[int]], shard_count: int
    ) -> dict[str, str]:
        """The config text of each node of this cluster for the shard layout `nodes` (node ->
        its shards; each shard's ClickHouse replicas are the nodes serving it), all else as
        the cluster was built with (ports, data dirs, rows_per_task): e.g. for a reshard."""
        if unknown := sorted(set(nodes) - set(self._ports)):
            raise ValueError(f"nodes {unknown} are not in this cluster")
        replicas: dict[int, dict[str, str]] = {}
        for node, shards in nodes.items():
            for shard in shards:
                replicas.setdefault(shard, {})[node] = self._replica_address(node, shard)
        return {
            node: self._render(
                node=node,
                shards=shards,
                shard_count=shard_count,
                data_dir=self.root / node,
                replicas=replicas,
                http_port=self._ports[node][0],
                flight_port=self._ports[node][1],
                rows_per_task=self._rows_per_task[node],
                session_timeout=self._session_timeouts[node],
                zookeeper_hosts=self._zookeeper_hosts.get(node),
            )
            for node, shards in nodes.items()
        }

    @property
    def replica_per_node(self) -> bool:
        """Whether each node reaches ClickHouse through an address of its own."""
        return self._replica_per_node

    def replica_ports(self) -> list[int]:
        """The ports of every node's own ClickHouse address (none without
        `replica_per_node`)."""
        return [int(f.listen.rsplit(":", 1)[1]) for f in self._replicas.values()]

    def _replica_address(self, node: str, shard: int) -> str:
        """The ClickHouse endpoint `node` names for `shard`: the server's, or with
        `replica_per_node` the node's own forwarder to it (made on first use)."""
        server = self.stack.clickhouse_of(shard)
        if not self._replica_per_node:
            return server
        forwarder = self._replicas.get((node, server))
        if forwarder is None:
            address = f"{LOOPBACK}:{free_port()}"
            forwarder = TcpForwarder(
                f"clickhouse replica of {node} ({address} -> {server})",
                [f"{address}={server}"],
                self.root / f"{node}-replica-{server.rsplit(':', 1)[1]}.log",
            )
            self._replicas[(node, server)] = forwarder
        return forwarder.listen

    def start_replica(self, node: str) -> None:
        """Start `node`'s own ClickHouse addresses that are not running (none without
        `replica_per_node`)."""
        for (owner, _), forwarder in self._replicas.items():
            if owner == node and not forwarder.alive():
                forwarder.start()

    def kill_replica(self, node: str) -> None:
        """SIGKILL `node`'s own ClickHouse addresses: its replica is gone (connections reset,
        new ones refused) until `start_replica`."""
        for (owner, _), forwarder in self._replicas.items():
            if owner == node:
                forwarder.kill()

    def start(self, timeout: float = 90.0) -> None:
        for name, node in self.nodes.items():
            self.start_replica(name)
            node.start()
        for node in self.nodes.values():
            node.wait_up(timeout)

    def stop(self) -> None:
        for node in self.nodes.values():
            node.stop()
        for forwarder in self._replicas.values():
            forwarder.stop()

    def kill(self) -> None:
        """SIGKILL every node and reap it: a test's end, where a clean stop (up to the flush
        grace with a block in flight) checks nothing. A node's Spark JVM ends with it (its
        gateway exits when its stdin closes), its Python workers with the JVM."""
        for node in self.nodes.values():
            node.kill(signal.SIGKILL)
        for forwarder in self._replicas.values():
            forwarder.kill()

    def leaders(self) -> dict[int, str]:
        """shard -> node, for shards whose leader consumes (as each node reports itself)."""
        found: dict[int, str] = {}
        for name, node in self.nodes.items():
            if node.alive():
                for shard in node.leads():
                    found[shard] = name
        return found

    def wait_leaders(self, shards: Sequence[int], timeout: float = 120.0) -> dict[int, str]:
        """Wait until every shard in `shards` has a consuming leader; return them."""
        wait_until(
            lambda: set(shards) <= set(self.leaders()),
            timeout=timeout,
            what=f"leaders of shards {list(shards)}",
        )
        return self.leaders()
