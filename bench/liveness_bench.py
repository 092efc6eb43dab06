"""Liveness (#38): what it costs to resolve an unknown outcome, and a probe under a flood.

Against a real 1-member ZooKeeper behind a fault-injecting proxy (`devstack.zk_proxy`), each
round times, from the first node's join (or resign) to the moment the right node leads:

- election, reply lost: the election multi-op reaches ZooKeeper, its reply is lost with the
  connection; the node reads `leader` back and adopts the term. Baseline: the same election
  with nothing lost, in the same run.
- resign, request lost: the resign multi-op is lost before the server; the node retries it
  until ZooKeeper confirms, and the next candidate leads. Baseline: a clean resign.

And the probe figure: `/health` answered while 100 half-sent requests hold every connection
of a server with `max_connections` 64 (the overflow reader answers it), next to the same
probe on an idle server.

Run: PYTHONPATH=. .venv/bin/python bench/liveness_bench.py
"""

from __future__ import annotations

import contextlib
import os
import socket
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import structlog

from buffer import Catalog, QueryLimits, SqlEngine
from buffer.http import HttpQueryServer, Route
from buffer.limits import ServerLimits
from devstack.process import wait_until
from devstack.zk_proxy import Op, ZkProxy
from devstack.zookeeper import ZooKeeperEnsemble
from hakafka.coordination import Coordinator, Leadership, LeadershipState, NodeInfo, ZkConfig

ROUNDS = 7
PROBES = 50
SESSION_TIMEOUT_S = 6.0


def leads(leadership: Leadership) -> bool:
    return leadership.state is LeadershipState.LEADER


def coordinator(hosts: str, root: str, node: str) -> Coordinator:
    config = ZkConfig(hosts=hosts, root=root, session_timeout_s=SESSION_TIMEOUT_S)
    made = Coordinator(config, node, NodeInfo("127.0.0.1", "", "", os.getpid(), "bench"))
    made.start()
    made.register()
    return made


def timed(what: str, act: Callable[[], None], done: Callable[[], bool]) -> float:
    started = time.monotonic()
    act()
    wait_until(done, timeout=30, what=what, interval=0.002)
    return time.monotonic() - started


def election_round(zk: ZooKeeperEnsemble, proxy: ZkProxy, round_: int, lose: bool) -> float:
    root = f"/bench/election-{'lost' if lose else 'clean'}-{round_}"
    with contextlib.closing(coordinator(zk.hosts, root, "n0")) as n0:
        n0.init_paths([0])  # the layout exists: the join's only multi-op is the election
    n1 = coordinator(proxy.hosts, root, "n1")
    try:
        if lose:
            proxy.drop_reply_to(Op.MULTI)
        joined: list[Leadership] = []
        took = timed(
            "n1 leading",
            lambda: joined.append(n1.join(0)),
            lambda: bool(joined) and leads(joined[0]),
        )
        if lose and not proxy.dropped_event.is_set():
            raise RuntimeError("the election multi-op was not lost: nothing was measured")
        return took
    finally:
        n1.close()


def resign_round(zk: ZooKeeperEnsemble, proxy: ZkProxy, round_: int, lose: bool) -> float:
    root = f"/bench/resign-{'lost' if lose else 'clean'}-{round_}"
    n1 = coordinator(proxy.hosts, root, "n1")
    n2 = coordinator(zk.hosts, root, "n2")
    try:
        first = n1.join(0)
        wait_until(lambda: leads(first), timeout=15, what="n1 leading")
        second = n2.join(0)
        n2._worker.submit(lambda: None).result(15)  # n2 stands
        if lose:
            proxy.lose_request_to(Op.MULTI)
        took = timed("n2 leading", lambda: first.resign("bench"), lambda: leads(second))
        if lose and not proxy.dropped_event.is_set():
            raise RuntimeError("the resign multi-op was not lost: nothing was measured")
        return took
    finally:
        n1.close()
        n2.close()


def probe_ms(port: int) -> float:
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.settimeout(5)
        sock.sendall(b"GET /health HTTP/1.1\r\nConnection: close\r\n\r\n")
        data = b""
        while chunk := sock.recv(4096):
            data += chunk
    if not data.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(f"probe answered {data[:40]!r}")
    return (time.monotonic() - started) * 1000


def probe_figures() -> tuple[list[float], list[float]]:
    health = Route(lambda: (200, "text/plain", b"ok\n"), public=True)
    engine = SqlEngine(Catalog(), QueryLimits())
    server = HttpQueryServer(
        engine,
        routes={"/health": health},
        limits=ServerLimits(max_connections=64, request_timeout=10.0),
    )
    server.start()
    held: list[socket.socket] = []
    try:
        idle = [probe_ms(server.port) for _ in range(PROBES)]
        for _ in range(100):
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
            sock.sendall(b"GET /query?sql=SELECT HTTP/1.1\r\nHost: x\r\n")
            held.append(sock)
        time.sleep(0.3)
        flooded = [probe_ms(server.port) for _ in range(PROBES)]
    finally:
        for sock in held:
            sock.close()
        server.close()
        engine.close()
    return idle, flooded


def line(name: str, samples: list[float], base: list[float], unit: float = 1000.0) -> str:
    med, worst, base_med = statistics.median(samples), max(samples), statistics.median(base)
    return (
        f"  {name:<34}median {med * unit:8.1f} ms  max {worst * unit:8.1f} ms"
        f"  median/baseline {med / base_med:5.1f}"
    )


def main() -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    with tempfile.TemporaryDirectory(prefix="liveness-bench-") as tmp:
        zk = ZooKeeperEnsemble(Path(tmp) / "zk", members=1)
        zk.start()
        try:
            with ZkProxy(("127.0.0.1", zk.members[0].client_port)) as proxy:
                clean_el = [election_round(zk, proxy, i, False) for i in range(ROUNDS)]
                lost_el = [election_round(zk, proxy, i, True) for i in range(ROUNDS)]
                clean_rs = [resign_round(zk, proxy, i, False) for i in range(ROUNDS)]
                lost_rs = [resign_round(zk, proxy, i, True) for i in range(ROUNDS)]
        finally:
            zk.stop()
    idle, flooded = probe_figures()
    print(
        f"liveness bench: 1-member ZooKeeper on 127.0.0.1 behind a TCP proxy, {ROUNDS} rounds "
        f"each, session timeout {SESSION_TIMEOUT_S:g} s, 2 cores"
    )
    print("unknown outcomes, join or resign -> the right node leads:")
    print(line("election, nothing lost (baseline)", clean_el, clean_el))
    print(line("election, reply lost", lost_el, clean_el))
    print(line("resign, nothing lost (baseline)", clean_rs, clean_rs))
    print(line("resign, request lost", lost_rs, clean_rs))
    print(
        f"probe: GET /health, {PROBES} each, max_connections 64, request_timeout 10 s, "
        "100 half-sent requests holding the connections"
    )
    print(line("idle server (baseline)", idle, idle, unit=1.0))
    print(line("while every connection is held", flooded, idle, unit=1.0))


if __name__ == "__main__":
    main()
