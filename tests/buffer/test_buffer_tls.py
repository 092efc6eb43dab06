"""Where the bearer token goes: the query servers over TLS, clients that verify them against a
CA, refuse plain-text URLs once TLS is asked for, and never follow a redirect.

Real servers on loopback (the query servers, and tiny `http.server`s standing in for a
hostile or misconfigured peer); every wait is bounded by a socket timeout of a few seconds.
"""

from __future__ import annotations

import socket
import ssl
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pyarrow as pa
import pytest

from buffer import SqlEngine
from buffer.client import (
    FORWARDED_BY,
    PlainTextRefusedError,
    QueryFailedError,
    RedirectRefusedError,
    open_url,
    query,
)
from buffer.flight import FlightQueryServer
from buffer.http import HttpQueryServer, Route
from buffer.limits import ServerLimits
from buffer.tls import ClientTls, ServerTls
from devstack.tls import CertificateFiles, make_certificates

TOKEN = "s3cret-token"
SQL = "SELECT count(*) AS n FROM events"
WAIT_S = 5.0


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> CertificateFiles:
    return make_certificates(tmp_path_factory.mktemp("tls"))


@pytest.fixture
def trusted(certs: CertificateFiles) -> ClientTls:
    return ClientTls(certs.ca_file)


@pytest.fixture
def https_server(engine: SqlEngine, certs: CertificateFiles) -> Iterator[HttpQueryServer]:
    server = HttpQueryServer(
        engine,
        token=TOKEN,
        tls=ServerTls(certs.cert_file, certs.key_file),
        limits=ServerLimits(request_timeout=WAIT_S),
    )
    server.start()
    yield server
    server.close()


@pytest.fixture
def flight_tls(engine: SqlEngine, certs: CertificateFiles) -> Iterator[FlightQueryServer]:
    server = FlightQueryServer(engine, token=TOKEN, tls=ServerTls(certs.cert_file, certs.key_file))
    yield server
    server.shutdown()


class _Recorder(ThreadingHTTPServer):
    """A plain HTTP server that records each request's path and Authorization header and
    answers `status` with `location` (a redirect) or an empty 200."""

    daemon_threads = True

    def __init__(self, status: int = 200, location: str | None = None) -> None:
        super().__init__(("127.0.0.1", 0), _RecordingHandler)
        self.status = status
        self.location = location
        self.seen: list[tuple[str, str | None]] = []
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def stop(self) -> None:
        self.shutdown()
        self.thread.join(timeout=WAIT_S)
        self.server_close()


class _RecordingHandler(BaseHTTPRequestHandler):
    server: _Recorder

    def log_message(self, format: str, *args: object) -> None:
        """Quiet."""

    def do_GET(self) -> None:
        self._answer()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._answer()

    def _answer(self) -> None:
        self.server.seen.append((self.path, self.headers.get("Authorization")))
        self.send_response(self.server.status)
        if self.server.location is not None:
            self.send_header("Location", self.server.location)
        self.send_header("Content-Length", "0")
        self.end_headers()


@pytest.fixture
def recorders() -> Iterator[list[_Recorder]]:
    started: list[_Recorder] = []
    yield started
    for r in started:
        r.stop()


def test_https_and_flight_tls_answer_a_client_that_trusts_the_ca(
    https_server: HttpQueryServer, flight_tls: FlightQueryServer, trusted: ClientTls
) -> None:
    assert https_server.url.startswith("https://")
    assert flight_tls.location.startswith("grpc+tls://")
    for url in (https_server.url, flight_tls.location):
        assert query(url, SQL, TOKEN, WAIT_S, tls=trusted).to_pylist() == [{"n": 1500}]
    # TLS does not replace the token.
    with pytest.raises(QueryFailedError, match="missing or wrong bearer token"):
        query(https_server.url, SQL, "wrong", WAIT_S, tls=trusted)
    with pytest.raises(QueryFailedError, match="missing or wrong bearer token"):
        query(flight_tls.location, SQL, "wrong", WAIT_S, tls=trusted)


def test_plain_text_clients_get_no_answer_from_tls_ports(
    https_server: HttpQueryServer, flight_tls: FlightQueryServer
) -> None:
    with socket.create_connection(("127.0.0.1", https_server.port), timeout=WAIT_S) as sock:
        sock.sendall(b"GET /query?sql=SELECT%201 HTTP/1.1\r\nHost: x\r\n\r\n")
        assert not sock.recv(4096).startswith(b"HTTP/")
    plain_flight = flight_tls.location.replace("grpc+tls://", "grpc://")
    with pytest.raises(QueryFailedError, match="unavailable"):
        query(plain_flight, SQL, TOKEN, WAIT_S)


def test_a_client_without_the_ca_refuses_the_servers(
    https_server: HttpQueryServer, flight_tls: FlightQueryServer
) -> None:
    system_cas = ClientTls()
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
        query(https_server.url, SQL, TOKEN, WAIT_S, tls=system_cas)
    with pytest.raises(QueryFailedError, match="certificate verify failed"):
        query(flight_tls.location, SQL, TOKEN, WAIT_S, tls=system_cas)


def test_a_silent_client_holds_only_its_own_connection(
    https_server: HttpQueryServer, trusted: ClientTls
) -> None:
    # The handshake runs on the connection's thread: one that never starts it does not stop
    # the accepting thread from serving the next client.
    with socket.create_connection(("127.0.0.1", https_server.port), timeout=WAIT_S):
        assert query(https_server.url, SQL, TOKEN, WAIT_S, tls=trusted).num_rows == 1


def test_a_tls_client_refuses_plain_text_urls_before_connecting(
    recorders: list[_Recorder], trusted: ClientTls
) -> None:
    plain = _Recorder()
    recorders.append(plain)
    with pytest.raises(PlainTextRefusedError, match="would send the bearer token in clear"):
        query(plain.url, SQL, TOKEN, WAIT_S, tls=trusted)
    with pytest.raises(PlainTextRefusedError, match="is not TLS"):
        query("grpc://127.0.0.1:1", SQL, TOKEN, WAIT_S, tls=trusted)
    assert plain.seen == []


def test_a_redirect_is_not_followed_and_the_token_stays_home(recorders: list[_Recorder]) -> None:
    elsewhere = _Recorder()
    redirecting = _Recorder(302, f"{elsewhere.url}/collect")
    recorders += [elsewhere, redirecting]
    with pytest.raises(QueryFailedError) as failed:
        query(redirecting.url, SQL, TOKEN, WAIT_S)
    assert failed.value.status == 302
    assert f"answered 302 redirecting to {elsewhere.url}/collect; not followed" in str(failed.value)
    request = urllib.request.Request(f"{redirecting.url}/status")
    request.add_header("Authorization", f"Bearer {TOKEN}")
    with pytest.raises(RedirectRefusedError, match=f"redirecting to {elsewhere.url}/collect"):
        open_url(request, None, WAIT_S)
    assert redirecting.seen == [
        ("/query?format=arrow", f"Bearer {TOKEN}"),
        ("/status", f"Bearer {TOKEN}"),
    ]
    assert elsewhere.seen == []


def test_a_forwarded_flight_call_names_its_sender_to_forward(
    engine: SqlEngine, certs: CertificateFiles, trusted: ClientTls
) -> None:
    seen: list[Mapping[str, str]] = []

    def forward(sql: str, params: Mapping[str, str]) -> pa.Table | None:
        seen.append(dict(params))
        return None

    server = FlightQueryServer(
        engine, forward=forward, tls=ServerTls(certs.cert_file, certs.key_file)
    )
    try:
        query(server.location, SQL, timeout_s=WAIT_S, tls=trusted, forwarded_by="n1")
        query(server.location, SQL, timeout_s=WAIT_S, tls=trusted)
    finally:
        server.shutdown()
    assert seen == [{FORWARDED_BY: "n1"}, {}]


def test_server_tls_with_a_key_that_is_not_the_certificates(
    certs: CertificateFiles, tmp_path: Path
) -> None:
    other = make_certificates(tmp_path / "other")
    with pytest.raises(ssl.SSLError, match="KEY_VALUES_MISMATCH"):
        ServerTls(certs.cert_file, other.key_file).context()


def test_an_https_probe_is_answered_while_every_connection_is_held(
    engine: SqlEngine, certs: CertificateFiles
) -> None:
    # Over the cap, the overflow reader does the TLS handshake itself, without blocking.
    health = Route(lambda: (200, "text/plain", b"ok\n"), public=True)
    server = HttpQueryServer(
        engine,
        token=TOKEN,
        routes={"/health": health},
        tls=ServerTls(certs.cert_file, certs.key_file),
        limits=ServerLimits(max_connections=2, request_timeout=WAIT_S),
    )
    server.start()
    held = [socket.create_connection(("127.0.0.1", server.port), timeout=WAIT_S) for _ in range(2)]
    try:
        context = ssl.create_default_context(cafile=str(certs.ca_file))
        with urllib.request.urlopen(
            f"{server.url}/health", timeout=WAIT_S, context=context
        ) as answer:
            assert (answer.status, answer.read()) == (200, b"ok\n")
    finally:
        for sock in held:
            sock.close()
        server.close()
