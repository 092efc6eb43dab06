"""HTTP query endpoint: ``GET/POST /query`` answering JSON, CSV or Arrow IPC."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import queue
import re
import selectors
import socket
import ssl
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from buffer.auth import HTTP_CHALLENGES, http_token_ok
from buffer.formats import Format, choose_format, encode
from buffer.limits import ServerLimits
from buffer.observe import Outcome, QueryObserver, observed
from buffer.sql import Forward, QueryError, QueryResult, SqlEngine, shard_of
from buffer.tls import ServerTls

_DIGITS = re.compile(r"[0-9]+")
# Sent to a connection over `max_connections` that is not a probe: no handler thread.
_BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
    b"Content-Length: %d\r\nConnection: close\r\nRetry-After: 1\r\n\r\n%s"
)
OVERFLOW_READ_S = 1.0  # how long a connection over the cap may take to send its request head
OVERFLOW_MAX = 256  # connections over the cap read at once; past it, 503 at once
OVERFLOW_HEAD_BYTES = 8192
OVERFLOW_TICK_S = 0.1


@dataclass(frozen=True)
class Route:
    """An extra GET endpoint: `handler()` returns (status, content type, body).

    `public` routes (e.g. a health check) answer without the bearer token.
    """

    handler: Callable[[], tuple[int, str, bytes]]
    public: bool = False


@dataclass(frozen=True)
class Reply:
    """What a POST route answers; `retry_after_s` sets Retry-After (a 429 or 503)."""

    status: int
    content_type: str
    body: bytes
    retry_after_s: float | None = None


@dataclass(frozen=True)
class PostRoute:
    """An extra POST endpoint: `handler(params, content_type, body)` answers. The token is
    checked and the body read (within `max_request_bytes`) before it is called."""

    handler: Callable[[dict[str, str], str, bytes], Reply]


@dataclass(frozen=True)
class _Refusal:
    status: int
    kind: str
    message: str


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        super().setup()
        # Bounds every read and write; handle_one_request drops the connection on a timeout.
        self.connection.settimeout(self.server.limits.request_timeout)
        if isinstance(self.connection, ssl.SSLSocket):
            # Here, not in the accepting thread: a slow or plain-text client holds only its own.
            self.connection.do_handshake()

    def log_message(self, format: str, *args: object) -> None:
        """Silence the per-request stderr log (the URL may hold SQL)."""

    def do_GET(self) -> None:
        self._serve(post=False)

    def do_POST(self) -> None:
        self._serve(post=True)

    def _serve(self, post: bool) -> None:
        """Route and token from the headers first; only then, for POST /query, the body."""
        url = urlsplit(self.path)
        body: bytes | None = None
        refusal = self._refusal(url.path, post)
        if refusal is None and post:
            body, refusal = self._read_body()
        elif "Content-Length" in self.headers or "Transfer-Encoding" in self.headers:
            # A body left unread would be parsed as the next request.
            self.close_connection = True
        if refusal is not None:
            self._error(refusal.status, refusal.kind, refusal.message)
            return
        route = self.server.routes.get(url.path)
        if route is not None:
            status, content_type, payload = route.handler()
            self._send_raw(status, content_type, payload)
            return
        post_route = self.server.post_routes.get(url.path)
        if post_route is not None:
            params = {k: v[-1] for k, v in parse_qs(url.query).items()}
            try:
                reply = post_route.handler(
                    params, self.headers.get("Content-Type") or "", body or b""
                )
            except Exception as exc:  # a bug in the route: an answer, not a reset connection
                self._error(500, "internal", f"{url.path} failed: {type(exc).__name__}")
                return
            self._send_chunks(reply.status, reply.content_type, [reply.body], reply.retry_after_s)
            return
        self._query(url.query, body)

    def _refusal(self, path: str, post: bool) -> _Refusal | None:
        route = self.server.routes.get(path)
        posted = path in self.server.post_routes
        if path != "/query" and route is None and not posted:
            known = ", ".join(sorted(["/query", *self.server.routes, *self.server.post_routes]))
            return _Refusal(404, "not_found", f"no endpoint {path}; use one of {known}")
        public = route is not None and route.public
        if not public and not http_token_ok(self.server.token, self.headers.get("Authorization")):
            return _Refusal(401, "unauthenticated", "missing or wrong bearer token")
        if post and route is not None:
            return _Refusal(405, "method_not_allowed", f"{path} answers GET only")
        if posted and not post:
            return _Refusal(405, "method_not_allowed", f"{path} answers POST only")
        return None

    def _read_body(self) -> tuple[bytes | None, _Refusal | None]:
        """The declared body, read only when its length is a valid one within the cap."""
        cap = self.server.limits.max_request_bytes
        lengths = self.headers.get_all("Content-Length") or []
        refusal = None
        if "Transfer-Encoding" in self.headers or not lengths:
            refusal = _Refusal(411, "length_required", "POST needs a Content-Length (no chunks)")
        elif len(set(lengths)) > 1 or not _DIGITS.fullmatch(lengths[0].strip()):
            given = ", ".join(lengths)[:40]
            refusal = _Refusal(400, "bad_request", f"Content-Length {given!r} is not a length")
        elif int(lengths[0]) > cap:
            refusal = _Refusal(413, "too_large", f"request body over {cap} bytes")
        if refusal is not None:
            self.close_connection = True
            return None, refusal
        return self.rfile.read(int(lengths[0])), None

    def _query(self, query: str, body: bytes | None) -> None:
        params = {k: v[-1] for k, v in parse_qs(query).items()}
        if body:
            if (self.headers.get("Content-Type") or "").startswith("application/json"):
                try:
                    doc = json.loads(body)
                    params.update({k: str(doc[k]) for k in ("sql", "format") if k in doc})
                except (ValueError, TypeError) as exc:
                    self._error(400, "bad_request", f"request body is not a JSON object: {exc}")
                    return
            else:
                params["sql"] = body.decode("utf-8", errors="replace")
        if not params.get("sql"):
            self._error(400, "bad_request", "no SQL: pass ?sql=... or POST it")
            return
        try:
            fmt = choose_format(params.get("format"), self.headers.get("Accept"))
        except ValueError as exc:
            self._error(400, "bad_request", str(exc))
            return
        queries = self.server.queries
        with observed(self.server.observe, "http") as outcome:
            if not queries.acquire(blocking=False):
                cap = self.server.limits.max_concurrent_queries
                outcome.result = "too_many_queries"
                self._error(429, outcome.result, f"{cap} queries running; retry later")
                return
            try:
                self._run(params, fmt, outcome)
            finally:
                queries.release()

    def _run(self, params: dict[str, str], fmt: Format, outcome: Outcome) -> None:
        engine = self.server.engine
        try:
            forwarded = self.server.forward(params["sql"], params) if self.server.forward else None
        except Exception as exc:  # a forward that failed (the leader is unreachable)
            outcome.result = "forward_failed"
            self._error(502, outcome.result, f"{type(exc).__name__}: {exc}")
            return
        try:
            if forwarded is not None:
                chunks = encode(QueryResult.of_table(forwarded, engine.limits), fmt)
            else:
                with engine.stream(params["sql"], shard_of(params)) as result:
                    chunks = encode(result, fmt)
        except QueryError as exc:
            outcome.result = exc.kind
            self._error(exc.http_status, exc.kind, str(exc))
            return
        self._send_chunks(200, fmt.value, chunks)

    def _error(self, status: int, kind: str, message: str) -> None:
        body = json.dumps({"error": kind, "message": message}).encode()
        self._send(status, Format.JSON, body)

    def _send(self, status: int, fmt: Format, body: bytes) -> None:
        self._send_raw(status, fmt.value, body)

    def _send_raw(self, status: int, content_type: str, body: bytes) -> None:
        self._send_chunks(status, content_type, [body])

    def _send_chunks(
        self,
        status: int,
        content_type: str,
        chunks: list[bytes],
        retry_after_s: float | None = None,
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(sum(len(c) for c in chunks)))
        if status == 401:
            for challenge in HTTP_CHALLENGES:
                self.send_header("WWW-Authenticate", challenge)
        if retry_after_s is not None or status == 429:
            self.send_header("Retry-After", str(max(1, round(retry_after_s or 1))))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        for chunk in chunks:
            self.wfile.write(chunk)


@dataclass
class _Waiting:
    """A connection over the cap whose request head is being read."""

    sock: socket.socket
    deadline: float
    head: bytes = b""
    handshaking: bool = False


class _Overflow:
    """Connections over `max_connections`, served without a thread each: one selector thread
    (`buffer-http-overflow`) reads each request head, non-blocking (TLS handshake included),
    for at most OVERFLOW_READ_S and OVERFLOW_HEAD_BYTES. A GET of a public route (a probe:
    `/health`, `/ready`, `/metrics`) is answered; anything else gets 503
    too_many_connections; a head not complete in time is dropped. So a flood of half-sent
    requests holds no thread, and a probe is still answered at once."""

    def __init__(self, routes: Callable[[], Mapping[str, Route]], busy: bytes) -> None:
        self._routes, self._busy = routes, busy
        self._selector = selectors.DefaultSelector()
        self._incoming: queue.SimpleQueue[socket.socket] = queue.SimpleQueue()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._slots = threading.BoundedSemaphore(OVERFLOW_MAX)
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="buffer-http-overflow", daemon=True)
        self._thread.start()

    def add(self, sock: socket.socket) -> None:
        """Take `sock` (accepting thread); 503 at once when OVERFLOW_MAX are being read."""
        if self._closed.is_set() or not self._slots.acquire(blocking=False):
            _send_close(sock, self._busy)
            return
        self._incoming.put(sock)
        self._wake()

    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError):  # full: a wake-up is pending anyway
            self._wake_w.send(b"x")

    def close(self) -> None:
        self._closed.set()
        self._wake()
        self._thread.join(timeout=5)
        for key in list(self._selector.get_map().values()):
            if isinstance(key.data, _Waiting):
                key.data.sock.close()
        self._selector.close()
        self._wake_r.close()
        self._wake_w.close()

    def _run(self) -> None:
        while not self._closed.is_set():
            for key, _ in self._selector.select(OVERFLOW_TICK_S):
                if key.data is None:
                    self._take_incoming()
                else:
                    self._step(key.data)
            now = time.monotonic()
            for key in list(self._selector.get_map().values()):
                if isinstance(key.data, _Waiting) and now >= key.data.deadline:
                    self._finish(key.data, None)  # too slow: dropped, as a handler would

    def _take_incoming(self) -> None:
        with contextlib.suppress(BlockingIOError):
            self._wake_r.recv(4096)
        while True:
            try:
                sock = self._incoming.get_nowait()
            except queue.Empty:
                return
            sock.setblocking(False)
            waiting = _Waiting(sock, time.monotonic() + OVERFLOW_READ_S)
            waiting.handshaking = isinstance(sock, ssl.SSLSocket)
            self._selector.register(sock, selectors.EVENT_READ, waiting)
            self._step(waiting)

    def _step(self, waiting: _Waiting) -> None:
        """Go on with `waiting` as far as its socket allows without blocking."""
        sock = waiting.sock
        try:
            if waiting.handshaking:
                assert isinstance(sock, ssl.SSLSocket)
                sock.do_handshake()
                waiting.handshaking = False
            while b"\r\n\r\n" not in waiting.head:
                chunk = sock.recv(OVERFLOW_HEAD_BYTES)
                if not chunk:
                    self._finish(waiting, None)
                    return
                waiting.head += chunk
                if len(waiting.head) > OVERFLOW_HEAD_BYTES:
                    break
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError):
            return  # more later
        except OSError:
            self._finish(waiting, None)
            return
        try:
            response = self._answer(waiting.head)
        except Exception:  # a route that failed: its connection ends, the reader goes on
            response = None
        self._finish(waiting, response)

    def _answer(self, head: bytes) -> bytes:
        """The response to a request head: a public route's, else the 503."""
        line = head.split(b"\r\n", 1)[0].split()
        if len(line) == 3 and line[0] == b"GET":
            path = urlsplit(line[1].decode("latin-1")).path
            route = self._routes().get(path)
            if route is not None and route.public:
                status, content_type, body = route.handler()
                return (
                    f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\n"
                    f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
                    "Connection: close\r\n\r\n"
                ).encode() + body
        return self._busy

    def _finish(self, waiting: _Waiting, response: bytes | None) -> None:
        self._selector.unregister(waiting.sock)
        self._slots.release()
        if response is None:
            waiting.sock.close()
            return
        _send_close(waiting.sock, response)


def _send_close(sock: socket.socket, response: bytes) -> None:
    """Send `response` (bounded: 1 s) and close `sock`."""
    try:
        sock.setblocking(True)
        sock.settimeout(1.0)  # a fresh socket's send buffer takes a small response at once
        sock.sendall(response)
    except OSError:
        pass  # the client is gone or not reading: nothing to tell it
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # socketserver listens with a backlog of 5: a burst of connects past it loses SYNs, which
    # clients retry after 1 s, 3 s... A queued connection holds no thread: over
    # `max_connections` it gets its 503 once accepted.
    request_queue_size = socket.SOMAXCONN

    def __init__(
        self,
        address: tuple[str, int],
        *,
        engine: SqlEngine,
        token: str | None,
        routes: Mapping[str, Route],
        post_routes: Mapping[str, PostRoute],
        forward: Forward | None,
        limits: ServerLimits,
        tls: ServerTls | None,
        observe: QueryObserver | None,
    ) -> None:
        super().__init__(address, _Handler)
        if tls is not None:
            self.socket = tls.context().wrap_socket(
                self.socket, server_side=True, do_handshake_on_connect=False
            )
        self.tls = tls
        self.engine = engine
        self.token = token
        self.routes = dict(routes)
        self.post_routes = dict(post_routes)
        self.forward = forward
        self.limits = limits
        self.observe = observe
        self.connections = threading.BoundedSemaphore(limits.max_connections)
        self.queries = threading.BoundedSemaphore(limits.max_concurrent_queries)
        message = f"{limits.max_connections} connections open; retry later"
        body = json.dumps({"error": "too_many_connections", "message": message}).encode()
        self.overflow = _Overflow(lambda: self.routes, _BUSY % (len(body), body))

    def process_request(self, request: Any, client_address: Any) -> None:
        """A handler thread per connection while under `max_connections`; over it, the
        overflow reader answers probes and refuses the rest (503)."""
        if not self.connections.acquire(blocking=False):
            self.overflow.add(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.connections.release()
            raise

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client's socket error (reset, timeout, failed TLS handshake) ends its connection
        quietly; anything else is printed as usual."""
        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.connections.release()


class HttpQueryServer:
    """Serves ``engine`` at ``http://host:port/query``; port 0 picks a free port.

    ``GET /query?sql=...&format=json|csv|arrow`` or ``POST /query`` with the SQL as body
    (or a JSON body ``{"sql": ..., "format": ...}``); without ``format`` the Accept header
    decides, default JSON; ``&shard=N`` reads only shard N's tables. Status: 200, 400 bad
    SQL (DuckDB's message), a shard that is not a number or row limit, 401 missing/wrong
    token, 403 refused by the sandbox, 408 timeout; errors are
    JSON ``{"error": kind, "message": text}``. The token of every non-public path comes as
    ``Bearer <token>`` or, from a browser, as HTTP Basic with the token as password (a 401
    offers both).

    ``limits`` bound each client: the route and token are checked before any body is read;
    a POST body needs a valid Content-Length within ``max_request_bytes`` (411 none or
    chunked, 400 not a length, 413 too large; the connection is then closed); a socket read
    waits at most ``request_timeout``; connections over ``max_connections`` are read by one
    overflow thread (1 s, 8 KiB for the request head, no thread each): a GET of a public
    route (a probe) is answered, anything else gets 503; queries over
    ``max_concurrent_queries`` get 429 at once.

    ``routes`` adds GET endpoints (a daemon's /health, /metrics...), ``post_routes`` POST
    ones (token and body limits as for a query); ``forward`` may answer a
    query elsewhere (502 if that fails). With ``tls`` it serves HTTPS only (the handshake
    runs on the connection's thread, under ``request_timeout``). ``observe`` hears of every
    query answered (protocol ``http``, result, seconds to the last byte sent).
    """

    def __init__(
        self,
        engine: SqlEngine,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | None = None,
        *,
        routes: Mapping[str, Route] | None = None,
        post_routes: Mapping[str, PostRoute] | None = None,
        forward: Forward | None = None,
        limits: ServerLimits | None = None,
        tls: ServerTls | None = None,
        observe: QueryObserver | None = None,
    ) -> None:
        self._server = _Server(
            (host, port),
            engine=engine,
            token=token,
            routes=routes or {},
            post_routes=post_routes or {},
            forward=forward,
            limits=limits or ServerLimits(),
            tls=tls,
            observe=observe,
        )
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="buffer-http", daemon=True
        )

    def reconfigure(self, token: str | None, limits: ServerLimits) -> None:
        """Take a new token and per-request bounds (`max_request_bytes`, `request_timeout`)
        from the next request on; the connection and query caps stay as started."""
        server = self._server
        server.token = token
        server.limits = dataclasses.replace(
            limits,
            max_connections=server.limits.max_connections,
            max_concurrent_queries=server.limits.max_concurrent_queries,
        )

    @property
    def port(self) -> int:
        """The bound port."""
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        """The base URL, e.g. http://127.0.0.1:8123 (https:// with TLS)."""
        scheme = "http" if self._server.tls is None else "https"
        return f"{scheme}://{self._server.server_address[0]!s}:{self.port}"

    def start(self) -> None:
        """Serve in a background thread."""
        self._thread.start()

    def close(self) -> None:
        """Stop serving and release the socket."""
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join(timeout=10)
        self._server.overflow.close()
        self._server.server_close()
