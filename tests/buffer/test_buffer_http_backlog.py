"""A burst of connections within `max_connections` is answered at once: none waits on a
refused SYN (the kernel retries those after 1 s, 3 s, ...) because the listen queue was full.

bench/security_bench.py found it: with socketserver's listen backlog of 5, 64 connects at once
left a third to half of them waiting 1-3 s, some over 10 s.
"""

from __future__ import annotations

import errno
import select
import socket
import time

from buffer import Catalog, SqlEngine
from buffer.http import HttpQueryServer, Route
from buffer.limits import ServerLimits

REQUEST = b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
PROMPT_S = 0.9  # under the first SYN retry (1 s): an answer later than this waited on one
WAIT_S = 10.0


def burst(port: int, count: int) -> list[tuple[bytes, float]]:
    """`count` connects at once, each sending REQUEST when connected: (answer, seconds from
    the connect to the server's close) per connection, in the order they ended."""
    connecting: dict[socket.socket, float] = {}
    reading: dict[socket.socket, tuple[float, bytes]] = {}
    ended: list[tuple[bytes, float]] = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.setblocking(False)
            assert sock.connect_ex(("127.0.0.1", port)) in (0, errno.EINPROGRESS)
            connecting[sock] = time.monotonic()
        deadline = time.monotonic() + WAIT_S
        while (connecting or reading) and time.monotonic() < deadline:
            readable, writable, _ = select.select(list(reading), list(connecting), [], 0.05)
            for sock in writable:
                assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0
                sock.sendall(REQUEST)
                reading[sock] = (connecting.pop(sock), b"")
            for sock in readable:
                began, answer = reading.pop(sock)
                chunk = sock.recv(65536)
                if chunk:
                    reading[sock] = (began, answer + chunk)
                    continue
                ended.append((answer, time.monotonic() - began))
                sock.close()
    finally:
        for sock in [*connecting, *reading]:
            sock.close()
    return ended


def test_a_burst_within_max_connections_is_answered_without_syn_retries() -> None:
    engine = SqlEngine(Catalog())
    limits = ServerLimits()
    health = Route(lambda: (200, "text/plain", b"ok\n"), public=True)
    server = HttpQueryServer(engine, routes={"/health": health}, limits=limits)
    server.start()
    try:
        ended = burst(server.port, limits.max_connections)
    finally:
        server.close()
        engine.close()
    assert len(ended) == limits.max_connections, f"only {len(ended)} answered in {WAIT_S} s"
    assert {answer.split(b" ", 2)[1] for answer, _ in ended} == {b"200"}
    late = sorted(seconds for _, seconds in ended if seconds >= PROMPT_S)
    assert late == [], f"{len(late)} of {len(ended)} waited {late[0]:.1f}-{late[-1]:.1f} s"
