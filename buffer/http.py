"""HTTP query endpoint: ``GET/POST /query`` answering JSON, CSV or Arrow IPC."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from buffer.auth import bearer_ok
from buffer.formats import Format, choose_format, encode
from buffer.sql import Forward, QueryError, SqlEngine

MAX_BODY_BYTES = 1 << 20


@dataclass(frozen=True)
class Route:
    """An extra GET endpoint: `handler()` returns (status, content type, body).

    `public` routes (e.g. a health check) answer without the bearer token.
    """

    handler: Callable[[], tuple[int, str, bytes]]
    public: bool = False


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        """Silence the per-request stderr log (the URL may hold SQL)."""

    def do_GET(self) -> None:
        self._handle(body=None)

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY_BYTES:
            self._error(413, "too_large", f"request body over {MAX_BODY_BYTES} bytes")
            self.close_connection = True
            return
        self._handle(body=self.rfile.read(length))

    def _handle(self, body: bytes | None) -> None:
        url = urlsplit(self.path)
        route = self.server.routes.get(url.path)
        if url.path != "/query" and route is None:
            known = ", ".join(sorted(["/query", *self.server.routes]))
            self._error(404, "not_found", f"no endpoint {url.path}; use one of {known}")
            return
        public = route is not None and route.public
        if not public and not bearer_ok(self.server.token, self.headers.get("Authorization")):
            self._error(401, "unauthenticated", "missing or wrong bearer token")
            return
        if route is not None:
            status, content_type, payload = route.handler()
            self._send_raw(status, content_type, payload)
            return
        params = {k: v[-1] for k, v in parse_qs(url.query).items()}
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
        try:
            forwarded = self.server.forward(params["sql"], params) if self.server.forward else None
            table = forwarded if forwarded is not None else self.server.engine.query(params["sql"])
        except QueryError as exc:
            self._error(exc.http_status, exc.kind, str(exc))
            return
        except Exception as exc:  # a forward that failed (the leader is unreachable)
            self._error(502, "forward_failed", f"{type(exc).__name__}: {exc}")
            return
        self._send(200, fmt, encode(table, fmt))

    def _error(self, status: int, kind: str, message: str) -> None:
        body = json.dumps({"error": kind, "message": message}).encode()
        self._send(status, Format.JSON, body)

    def _send(self, status: int, fmt: Format, body: bytes) -> None:
        self._send_raw(status, fmt.value, body)

    def _send_raw(self, status: int, content_type: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        if status == 401:
            self.send_header("WWW-Authenticate", "Bearer")
        self.end_headers()
        self.wfile.write(body)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(
        self,
        address: tuple[str, int],
        engine: SqlEngine,
        token: str | None,
        routes: Mapping[str, Route],
        forward: Forward | None,
    ) -> None:
        super().__init__(address, _Handler)
        self.engine = engine
        self.token = token
        self.routes = dict(routes)
        self.forward = forward


class HttpQueryServer:
    """Serves ``engine`` at ``http://host:port/query``; port 0 picks a free port.

    ``GET /query?sql=...&format=json|csv|arrow`` or ``POST /query`` with the SQL as body
    (or a JSON body ``{"sql": ..., "format": ...}``); without ``format`` the Accept header
    decides, default JSON. Status: 200, 400 bad SQL (DuckDB's message) or row limit,
    401 missing/wrong bearer token, 403 refused by the sandbox, 408 timeout; errors are
    JSON ``{"error": kind, "message": text}``.

    ``routes`` adds GET endpoints (a daemon's /health, /metrics...); ``forward`` may answer a
    query elsewhere (502 if that fails).
    """

    def __init__(
        self,
        engine: SqlEngine,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | None = None,
        *,
        routes: Mapping[str, Route] | None = None,
        forward: Forward | None = None,
    ) -> None:
        self._server = _Server((host, port), engine, token, routes or {}, forward)
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="buffer-http", daemon=True
        )

    @property
    def port(self) -> int:
        """The bound port."""
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        """The base URL, e.g. http://127.0.0.1:8123."""
        return f"http://{self._server.server_address[0]!s}:{self.port}"

    def start(self) -> None:
        """Serve in a background thread."""
        self._thread.start()

    def close(self) -> None:
        """Stop serving and release the socket."""
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join(timeout=10)
        self._server.server_close()
