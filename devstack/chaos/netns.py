"""A daemon in a network namespace of its own (root and iproute2 needed), joined to the root
namespace by a veth pair that a fault takes down: a real partition from ZooKeeper, the broker
and ClickHouse. Its traffic to the services on 127.0.0.1 goes through `devstack.tcp_forward`."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

from devstack.cluster import DaemonNode
from devstack.process import LOOPBACK, DevstackError, ManagedProcess
from devstack.tcp_forward import TcpForwarder
from hakafka.coordination import paths


def netns_unavailable() -> str | None:
    """Why a daemon cannot run in a network namespace of its own here, or None if it can."""
    if os.geteuid() != 0:
        return "not root: creating a network namespace and a veth pair needs CAP_NET_ADMIN"
    if shutil.which("ip") is None:
        return "iproute2 is not installed (no `ip` command): apt-get install iproute2"
    return None


def addresses_in_use() -> list[str]:
    """Every IPv4 address of this (the root) namespace's interfaces, a namespace left behind
    by an interrupted run included: its veth pair's root end stays here."""
    done = subprocess.run(
        ["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True, timeout=10, check=False
    )
    return [line.split()[3].split("/")[0] for line in done.stdout.splitlines() if line.split()[3:]]


def free_pair(used: Iterable[str], prefix: str = "10.213") -> tuple[str, str]:
    """The two host addresses of the first /30 of `prefix`.0.0/16 with no address in `used`:
    a leftover namespace on one /30 then cannot shadow the next run's."""
    taken = set(used)
    for start in range(0, 1 << 16, 4):
        block = [f"{prefix}.{(start + i) >> 8}.{(start + i) & 255}" for i in range(4)]
        if taken.isdisjoint(block):
            return block[1], block[2]
    raise DevstackError(f"no free /30 left in {prefix}.0.0/16")


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10, check=False)
    if done.returncode != 0:
        raise DevstackError(f"`ip {' '.join(args)}` failed: {done.stderr.strip()}")


class NetworkNamespace:
    """A network namespace joined to the root one by a veth pair (`root_addr`/30 on our side,
    `ns_addr` inside: by default the first /30 of 10.213.0.0/16 not in use), with TCP
    forwarders so that a daemon inside reaches the services on
    127.0.0.1 of the root namespace, and the tests reach its admin port, at the same
    addresses as everywhere else. `cut` takes the veth link down: nothing gets through either
    way until `heal`. Only the loopback addresses and this veth pair ever carry traffic."""

    def __init__(
        self,
        name: str,
        root: Path,
        *,
        addresses: tuple[str, str] | None = None,
    ) -> None:
        self.name = paths.check_name("namespace", name)
        self.root = root
        self.root_addr, self.ns_addr = addresses or free_pair(addresses_in_use())
        self.veth_root, self.veth_ns = f"{name[:13]}a", f"{name[:13]}b"
        self.forwarders: list[TcpForwarder] = []
        self._created = False

    @property
    def exec_prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.name]

    def create(self) -> None:
        """Create the namespace and the veth pair (raises DevstackError saying what failed)."""
        _ip("netns", "add", self.name)
        self._created = True
        _ip("link", "add", self.veth_root, "type", "veth", "peer", "name", self.veth_ns)
        _ip("link", "set", self.veth_ns, "netns", self.name)
        _ip("addr", "add", f"{self.root_addr}/30", "dev", self.veth_root)
        _ip("link", "set", self.veth_root, "up")
        inside = ["netns", "exec", self.name, "ip"]
        _ip(*inside, "addr", "add", f"{self.ns_addr}/30", "dev", self.veth_ns)
        _ip(*inside, "link", "set", self.veth_ns, "up")
        _ip(*inside, "link", "set", "lo", "up")

    def forward(self, service_ports: Iterable[int], admin_ports: Iterable[int]) -> None:
        """Start the forwarders: the namespace's 127.0.0.1:<service port> reaches the root's,
        the root's 127.0.0.1:<admin port> reaches the namespace's."""
        services, admins = list(service_ports), list(admin_ports)
        outside = [f"{self.root_addr}:{p}={LOOPBACK}:{p}" for p in services] + [
            f"{LOOPBACK}:{p}={self.ns_addr}:{p}" for p in admins
        ]
        inside = [f"{LOOPBACK}:{p}={self.root_addr}:{p}" for p in services] + [
            f"{self.ns_addr}:{p}={LOOPBACK}:{p}" for p in admins
        ]
        for side, prefix, specs in (("root", [], outside), ("netns", self.exec_prefix, inside)):
            forwarder = TcpForwarder(
                f"chaos forwarder ({side} side of {self.name})",
                specs,
                self.root / f"forward-{self.name}-{side}.log",
                prefix,
            )
            self.forwarders.append(forwarder)
            forwarder.start()

    def start_daemon(self, node: DaemonNode, env: Mapping[str, str] | None = None) -> None:
        """Start `node`'s `hakafka run` inside the namespace (a new process each time)."""
        node.process = ManagedProcess(
            name=f"hakafka daemon {node.name} (netns {self.name})",
            argv=[
                *self.exec_prefix,
                sys.executable,
                "-m",
                "hakafka.cli",
                "run",
                "--config",
                str(node.config_path),
            ],
            log_path=node.log_path,
            marker=str(node.config_path),
            env={"ARROW_DEFAULT_MEMORY_POOL": "jemalloc", **(env or {})},
        )
        node.process.start()

    def cut(self) -> None:
        """Take the veth link down: the namespace is cut off from everything outside it."""
        _ip("link", "set", self.veth_root, "down")

    def heal(self) -> None:
        _ip("link", "set", self.veth_root, "up")

    def delete(self) -> None:
        """Stop the forwarders by PID and delete the namespace (and with it the veth pair)."""
        for forwarder in self.forwarders:
            forwarder.stop()
        self.forwarders = []
        if self._created:
            with contextlib.suppress(DevstackError):
                _ip("netns", "delete", self.name)
            with contextlib.suppress(DevstackError):
                _ip("link", "delete", self.veth_root)
            self._created = False
