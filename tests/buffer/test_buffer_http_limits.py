"""The query servers fail closed on bad or greedy clients: raw sockets for HTTP, and Flight.

Each case waits a bounded time (socket timeouts of a few seconds): a server that reads a body
it should refuse, or never answers, fails the test instead of hanging it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import threading
import time
from collections.abc import Iterator, Mapping

import pyarrow as pa
import pyarrow.flight as fl
import pytest

from buffer import SqlEngine
from buffer.flight import FlightQueryServer
from buffer.http import HttpQueryServer, PostRoute, Reply, Route
from buffer.limits import ServerLimits
from buffer.sql import Forward
from hakafka.config import NodeServerConfig, parse_config
from hakafka.settings import server_limits
from tests.helpers.configs import minimal

TOKEN = "s3cret-token"
AUTH = f"Authorization: Bearer {TOKEN}\r\n"
WAIT_S = 5.0  # longest any single read from the server may take in these tests


def limited(
    engine: SqlEngine, limits: ServerLimits, forward: Forward | None = None
) -> HttpQueryServer:
    """A started server with a public /health, the token and `limits`."""
    health = Route(lambda: (200, "text/plain", b"ok\n"), public=True)
    server = HttpQueryServer(
        engine, token=TOKEN, routes={"/health": health}, forward=forward, limits=limits
    )
    server.start()
    return server


@pytest.fixture
def server(engine: SqlEngine) -> Iterator[HttpQueryServer]:
    s = limited(engine, ServerLimits(max_request_bytes=1000, request_timeout=WAIT_S))
    yield s
    s.close()


def connect(server: HttpQueryServer) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=WAIT_S)
    sock.settimeout(WAIT_S)
    return sock


def read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """Status, headers (lower-case names) and body of one response."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed before a full response: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = head.decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    while len(body) < int(headers["content-length"]):
        chunk = sock.recv(65536)
        assert chunk, "connection closed inside the body"
        body += chunk
    return int(status_line.split()[1]), headers, body


def exchange(server: HttpQueryServer, request: str) -> tuple[int, dict[str, str], bytes, bytes]:
    """Send `request` (headers only, maybe a partial body) and return the response and what
    follows it until the server closes (b"" for a clean close)."""
    with connect(server) as sock:
        sock.sendall(request.encode())
        status, headers, body = read_response(sock)
        return status, headers, body, sock.recv(1)


def error_of(body: bytes) -> str:
    doc = json.loads(body)
    assert set(doc) == {"error", "message"}
    return str(doc["error"])


def test_unauthenticated_post_is_refused_before_its_body_is_read(server: HttpQueryServer) -> None:
    # The 1000 declared bytes never come: a server reading them first would wait, then time out.
    for path, status, kind in [("/query", 401, "unauthenticated"), ("/nope", 404, "not_found")]:
        request = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n"
        started = time.monotonic()
        got, headers, body, after = exchange(server, request)
        assert (got, error_of(body)) == (status, kind)
        assert time.monotonic() - started < WAIT_S / 2
        assert headers["connection"] == "close"
        assert after == b""


@pytest.mark.parametrize(
    ("length_header", "status", "kind"),
    [
        ("Content-Length: -1\r\n", 400, "bad_request"),
        ("Content-Length: abc\r\n", 400, "bad_request"),
        ("Content-Length: 10\r\nContent-Length: 20\r\n", 400, "bad_request"),
        ("", 411, "length_required"),
        ("Transfer-Encoding: chunked\r\n", 411, "length_required"),
        ("Content-Length: 1001\r\n", 413, "too_large"),
    ],
)
def test_post_body_length_is_validated_before_reading(
    server: HttpQueryServer, length_header: str, status: int, kind: str
) -> None:
    request = f"POST /query HTTP/1.1\r\nHost: x\r\n{AUTH}{length_header}\r\n"
    got, headers, body, after = exchange(server, request)
    assert (got, error_of(body)) == (status, kind)
    assert headers["connection"] == "close"
    assert after == b""


def test_post_within_the_cap_still_answers_and_keeps_the_connection(
    server: HttpQueryServer,
) -> None:
    sql = b"SELECT count(*) AS n FROM events"
    request = f"POST /query HTTP/1.1\r\nHost: x\r\n{AUTH}Content-Length: {len(sql)}\r\n\r\n"
    with connect(server) as sock:
        for _ in range(2):  # keep-alive: the second request on the same connection
            sock.sendall(request.encode() + sql)
            status, _, body = read_response(sock)
            assert (status, json.loads(body)["rows"]) == (200, [{"n": 1500}])


def test_a_half_sent_request_is_dropped_after_the_timeout(engine: SqlEngine) -> None:
    server = limited(engine, ServerLimits(request_timeout=0.5))
    try:
        for partial in [
            "GET /health HTTP/1.1\r\nHost: x\r\n",
            f"POST /query HTTP/1.1\r\n{AUTH}Content-Length: 100\r\n\r\nSELECT",
        ]:
            with connect(server) as sock:
                sock.sendall(partial.encode())
                started = time.monotonic()
                assert sock.recv(1) == b""  # closed by the server, no answer
                assert 0.4 < time.monotonic() - started < WAIT_S / 2
    finally:
        server.close()


def test_connections_over_the_cap_get_503_at_once(engine: SqlEngine) -> None:
    server = limited(engine, ServerLimits(max_connections=2, request_timeout=WAIT_S))
    try:
        held = [connect(server) for _ in range(2)]
        for sock in held:
            sock.sendall(b"GET /health HTTP/1.1\r\n")  # half-sent: each holds a handler
        time.sleep(0.2)  # let the server accept both
        query = f"GET /query?sql=SELECT%201 HTTP/1.1\r\n{AUTH}\r\n"
        status, headers, body, after = exchange(server, query)
        assert (status, error_of(body), after) == (503, "too_many_connections", b"")
        assert headers["connection"] == "close"
        for sock in held:
            sock.close()
        deadline = time.monotonic() + WAIT_S
        while True:  # the freed handlers end once they see the close
            status, _, body, _ = exchange(
                server, "GET /health HTTP/1.1\r\nConnection: close\r\n\r\n"
            )
            if status == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert (status, body) == (200, b"ok\n")
    finally:
        server.close()


def test_probes_answer_within_a_second_while_half_sent_requests_hold_every_connection(
    engine: SqlEngine,
) -> None:
    # 100 clients send half a request and wait (a slow or hostile client, a broken load
    # balancer): the 64 connections of the cap are taken for request_timeout (10 s). A probe
    # must still be told the truth at once, or it takes a healthy leader for a dead one.
    limits = ServerLimits(max_connections=64, request_timeout=10.0)
    ready = Route(lambda: (503, "text/plain", b"not ready: shard 0 ...\n"), public=True)
    server = HttpQueryServer(
        engine,
        token=TOKEN,
        routes={
            "/health": Route(lambda: (200, "text/plain", b"ok\n"), public=True),
            "/ready": ready,
            "/metrics": Route(lambda: (200, "text/plain", b"up 1\n"), public=True),
        },
        limits=limits,
    )
    server.start()
    held = []
    try:
        for _ in range(100):
            sock = connect(server)
            sock.sendall(b"GET /query?sql=SELECT HTTP/1.1\r\nHost: x\r\n")
            held.append(sock)
        time.sleep(0.3)  # accepted: 64 hold handlers, 36 wait in the overflow reader
        for path, want in (
            ("/health", (200, b"ok\n")),
            ("/ready", (503, b"not ready: shard 0 ...\n")),
            ("/metrics", (200, b"up 1\n")),
        ):
            started = time.monotonic()
            status, headers, body, after = exchange(server, f"GET {path} HTTP/1.1\r\n\r\n")
            took = time.monotonic() - started
            assert (status, body) == want, path
            assert took < 1.0, f"{path} took {took:.2f} s"
            assert headers["connection"] == "close" and after == b""
        # Not a probe: refused at once, holding nothing.
        query = f"GET /query?sql=SELECT%201 HTTP/1.1\r\n{AUTH}\r\n"
        status, _, body, _ = exchange(server, query)
        assert (status, error_of(body)) == (503, "too_many_connections")
        # A slow client over the cap is dropped after 1 s without an answer.
        with connect(server) as slow:
            slow.sendall(b"GET /health HTTP/1.1\r\n")
            started = time.monotonic()
            assert slow.recv(1) == b""
            assert 0.5 < time.monotonic() - started < 3.0
    finally:
        for sock in held:
            sock.close()
        server.close()


def test_a_probe_route_that_fails_over_the_cap_ends_its_connection_only(
    engine: SqlEngine,
) -> None:
    def broken() -> tuple[int, str, bytes]:
        raise RuntimeError("the route failed")

    server = HttpQueryServer(
        engine,
        token=TOKEN,
        routes={
            "/health": Route(lambda: (200, "text/plain", b"ok\n"), public=True),
            "/broken": Route(broken, public=True),
        },
        limits=ServerLimits(max_connections=1, request_timeout=WAIT_S),
    )
    server.start()
    held = connect(server)
    try:
        held.sendall(b"GET /health HTTP/1.1\r\n")  # half-sent: holds the one handler
        time.sleep(0.2)
        with connect(server) as sock:
            sock.sendall(b"GET /broken HTTP/1.1\r\n\r\n")
            assert sock.recv(1) == b""  # closed, no answer
        # The overflow reader goes on: the next probe is still answered.
        status, _, body, _ = exchange(server, "GET /health HTTP/1.1\r\n\r\n")
        assert (status, body) == (200, b"ok\n")
    finally:
        held.close()
        server.close()


class Gate:
    """A forward hook that holds each query until released (bounded), answering nothing."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    def __call__(self, sql: str, params: Mapping[str, str]) -> pa.Table | None:
        self.entered.set()
        assert self.release.wait(WAIT_S)
        return None


def test_queries_over_the_cap_get_429_without_running(engine: SqlEngine) -> None:
    gate = Gate()
    limits = ServerLimits(max_concurrent_queries=1, request_timeout=WAIT_S)
    server = limited(engine, limits, forward=gate)
    sql = "GET /query?sql=SELECT%20count(*)%20AS%20n%20FROM%20events HTTP/1.1\r\nHost: x\r\n"
    try:
        with connect(server) as first:
            first.sendall(f"{sql}{AUTH}\r\n".encode())
            assert gate.entered.wait(WAIT_S)
            gate.entered.clear()
            status, headers, body, _ = exchange(server, f"{sql}{AUTH}Connection: close\r\n\r\n")
            assert (status, error_of(body), headers["retry-after"]) == (
                429,
                "too_many_queries",
                "1",
            )
            assert not gate.entered.is_set()  # refused before the forward hook ran
            gate.release.set()
            status, _, body = read_response(first)
            assert (status, json.loads(body)["rows"]) == (200, [{"n": 1500}])
    finally:
        gate.release.set()
        server.close()


@pytest.fixture
def flight(engine: SqlEngine) -> Iterator[tuple[FlightQueryServer, Gate]]:
    gate = Gate()
    server = FlightQueryServer(engine, forward=gate, limits=ServerLimits(max_concurrent_queries=1))
    yield server, gate
    gate.release.set()
    server.shutdown()


def test_flight_non_utf8_ticket_gets_a_clean_error(
    flight: tuple[FlightQueryServer, Gate],
) -> None:
    server, _ = flight
    options = fl.FlightCallOptions(timeout=WAIT_S)
    with fl.connect(server.location) as client, pytest.raises(fl.FlightServerError) as err:
        client.do_get(fl.Ticket(b"SELECT '\xff'"), options=options).read_all()
    message = str(err.value)
    assert message.startswith("the ticket is not UTF-8 SQL: invalid start byte. Detail: ")
    assert "Traceback" not in message
    assert os.sep + "buffer" + os.sep not in message  # no server file paths


def test_flight_queries_over_the_cap_are_unavailable(
    flight: tuple[FlightQueryServer, Gate],
) -> None:
    server, gate = flight
    options = fl.FlightCallOptions(timeout=WAIT_S)
    ticket = fl.Ticket(b"SELECT count(*) AS n FROM events")
    results: list[pa.Table] = []

    def first_query() -> None:
        with fl.connect(server.location) as client:
            results.append(client.do_get(ticket, options=options).read_all())

    first = threading.Thread(target=first_query)
    first.start()
    try:
        assert gate.entered.wait(WAIT_S)
        gate.entered.clear()
        busy = r"^1 queries running; retry later\. Detail"
        with (
            fl.connect(server.location) as client,
            pytest.raises(fl.FlightUnavailableError, match=busy),
        ):
            client.do_get(ticket, options=options).read_all()
        assert not gate.entered.is_set()
    finally:
        gate.release.set()
        first.join(WAIT_S)
    assert [t.to_pylist() for t in results] == [[{"n": 1500}]]


def test_server_keys_default_to_the_library_limits_and_reach_it() -> None:
    names = [f.name for f in dataclasses.fields(ServerLimits)]
    defaults = NodeServerConfig()
    assert ServerLimits(**{n: getattr(defaults, n) for n in names}) == ServerLimits()
    server = {
        "max_request_bytes": 4096,
        "request_timeout": 2.5,
        "max_connections": 8,
        "max_concurrent_queries": 2,
    }
    config = parse_config(minimal(server=server))
    assert server_limits(config) == ServerLimits(4096, 2.5, 8, 2)


def test_a_post_route_gets_its_params_and_body_after_the_token_and_the_length(
    engine: SqlEngine,
) -> None:
    seen: list[tuple[dict[str, str], str, bytes]] = []

    def handler(params: dict[str, str], content_type: str, body: bytes) -> Reply:
        seen.append((params, content_type, body))
        return Reply(429, "application/json", b'{"error": "full"}', retry_after_s=3.2)

    server = HttpQueryServer(
        engine,
        token=TOKEN,
        post_routes={"/insert": PostRoute(handler)},
        limits=ServerLimits(max_request_bytes=1000, request_timeout=WAIT_S),
    )
    server.start()
    try:
        # No token, a body over the cap, a GET: refused before the handler or the body.
        head = "POST /insert HTTP/1.1\r\nHost: x\r\n"
        for request, status, kind in [
            (f"{head}Content-Length: 1000\r\n\r\n", 401, "unauthenticated"),
            (f"{head}{AUTH}Content-Length: 1001\r\n\r\n", 413, "too_large"),
            (f"GET /insert HTTP/1.1\r\n{AUTH}Connection: close\r\n\r\n", 405, "method_not_allowed"),
        ]:
            got, _, body, _ = exchange(server, request)
            assert (got, error_of(body)) == (status, kind)
        assert seen == []
        payload = b'{"id": 1}\n'
        request = (
            f"POST /insert?pipeline=events&writer=w HTTP/1.1\r\nHost: x\r\n{AUTH}"
            "Content-Type: application/x-ndjson\r\nConnection: close\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n"
        )
        got, headers, body, _ = exchange(server, request + payload.decode())
        assert (got, body, headers["retry-after"]) == (429, b'{"error": "full"}', "3")
        assert seen == [({"pipeline": "events", "writer": "w"}, "application/x-ndjson", payload)]
    finally:
        server.close()
