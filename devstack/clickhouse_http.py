"""The ClickHouse HTTP interface served by chdb (the ClickHouse 26 engine), as its own process.

Run as ``python -m devstack.clickhouse_http --port P --data DIR [--user U]
[--tls-cert PEM --tls-key PEM]`` (the password comes from the environment variable named by
``PASSWORD_ENV``, never from argv; with a certificate and key it serves HTTPS only).
The server promises what clickhouse-connect's HTTP client relies on:

- ``GET /`` and ``GET /ping`` answer ``Ok.\\n``; queries go to ``/`` as GET or POST.
- The query comes from the ``query`` URL parameter, the body, or both (``query + "\\n" +
  body``, as ClickHouse concatenates them); ``database``, ``session_id`` (one chdb connection
  per session, so temporary tables and ``SET`` live in it), ``session_timeout``,
  ``session_check``, ``query_id``, ``default_format``, ``param_<name>`` query parameters and any
  other URL parameter as a ClickHouse setting for this one query (``insert_deduplication_token``
  included). URL settings and ``database`` do not leak into the session's later queries.
- Request bodies may be chunked and compressed (``Content-Encoding`` gzip, deflate, zstd, lz4
  frames; concatenated frames allowed).
- ``INSERT INTO t [(cols)] [SETTINGS ...] FORMAT F`` takes its data from the rest of the
  request (any input format chdb knows: Native, Arrow, ArrowStream, RowBinary, JSONEachRow,
  ...). The data reaches the engine through chdb's streaming insert, the same INSERT pipeline
  as clickhouse-server, so block deduplication (``insert_deduplication_token``,
  ``non_replicated_deduplication_window``) applies exactly as in ClickHouse.
- Results come back in the requested format with ``X-ClickHouse-Query-Id``, ``-Format`` (for
  statements that produce a result), ``-Timezone`` and ``-Summary``; errors as
  ``Code: N. DB::Exception: ... (NAME)`` with ``X-ClickHouse-Exception-Code: N`` and the HTTP
  status ClickHouse uses for that code (404 unknown table, 400 syntax, 403 auth, ...).
- Optional credentials (HTTP basic auth, ``X-ClickHouse-User``/``-Key`` headers or
  ``user``/``password`` URL parameters); a mismatch is ``Code: 516`` with HTTP 403.

Limits (the engine is ClickHouse 26 through chdb 4.4; documented, not hidden):

- One process per data path (chdb locks it). Stop the server before opening the path elsewhere.
- One request's data becomes ONE insert block: the squashing thresholds
  (``min_insert_block_size_rows``/``_bytes``, ``max_insert_block_size``) are raised to 2^40 on
  every connection, so a retried request with the same token dedups as a whole (one part per
  partition). The price: the whole request body and its block are held in memory; request
  bodies are capped by ``--max-body-bytes`` (2 GiB by default; beyond it: Code 202, HTTP 413).
- Results are materialized before the response is sent (no streaming; errors keep their
  status code), so a query's result must fit in memory.
- ``Native`` output is protocol version 0 (no LowCardinality on the wire, no block info):
  clickhouse-connect's protocol probe fails and it falls back to that, as designed.
- HTTP-only settings (``wait_end_of_query``, ``send_progress_in_http_headers``,
  ``http_headers_progress_interval_ms``, ``enable_http_compression``, ``compress``,
  ``decompress``, ``buffer_size``, ``client_protocol_version``, ``quota_key``, ``role``) are
  accepted and ignored: responses are never compressed and no progress headers are sent.
- Multipart/form-data requests (external data, form-encoded query parameters) are refused
  with Code 48 (NOT_IMPLEMENTED), HTTP 501; so is ClickHouse's own block compression
  (``decompress=1``).
- One user; no grants, quotas, readonly-GET mode or query cancellation on client disconnect.
- ``X-ClickHouse-Summary`` carries read/written rows and bytes and the elapsed time; a
  deduplicated insert still reports the rows it was given (chdb reports them so).
- Concurrent queries in one session wait up to 10 s for it, then fail with Code 373
  (SESSION_IS_LOCKED); idle sessions expire after ``session_timeout`` (60 s by default), at
  most 1000 sessions are kept.
- URL settings are applied with ``SET`` on the session's connection and undone before the next
  request that does not want them (or before a ``SET``/``USE`` statement). A setting whose
  session value is ``auto(N)`` (``max_threads``) comes back as ``N``.
- ``SETTINGS`` inside an ``INSERT ... FORMAT`` statement work; ``INSERT`` data inline in the
  URL ``query`` parameter is fine, but the statement must fit in the first 64 KiB.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import gzip
import hmac
import json
import logging
import os
import re
import signal
import ssl
import sys
import threading
import time
import uuid
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import chdb
import structlog

from buffer.tls import ServerTls

PASSWORD_ENV = "HAKAFKA_CLICKHOUSE_PASSWORD"
DEFAULT_MAX_BODY = 2 << 30
# Squash one request's data into one block (see the module docstring).
_ONE_BLOCK = 1 << 40
_CONNECTION_SETTINGS = (
    f"min_insert_block_size_rows={_ONE_BLOCK}&min_insert_block_size_bytes={_ONE_BLOCK}"
    f"&max_insert_block_size={_ONE_BLOCK}"
)
_APPEND_CHUNK = 16 << 20
_SESSION_WAIT = 10.0
_MAX_SESSIONS = 1000

# URL parameters the HTTP layer consumes itself or ignores (never passed on as settings).
_HTTP_PARAMS = frozenset(
    {
        "query",
        "database",
        "session_id",
        "session_timeout",
        "session_check",
        "query_id",
        "default_format",
        "user",
        "password",
        "quota_key",
        "role",
        "compress",
        "decompress",
        "buffer_size",
        "wait_end_of_query",
        "client_protocol_version",
        "send_progress_in_http_headers",
        "http_headers_progress_interval_ms",
        "enable_http_compression",
        "http_response_buffer_size",
        "http_wait_end_of_query",
        "cancel_http_readonly_queries_on_client_close",
    }
)

_HTTP_STATUS_BY_NAME: Mapping[str, int] = {
    "REQUIRED_PASSWORD": 401,
    **dict.fromkeys(
        (
            "UNKNOWN_USER",
            "WRONG_PASSWORD",
            "AUTHENTICATION_FAILED",
            "SET_NON_GRANTED_ROLE",
            "ACCESS_DENIED",
        ),
        403,
    ),
    **dict.fromkeys(
        (
            "BAD_ARGUMENTS",
            "CANNOT_COMPILE_REGEXP",
            "CANNOT_PARSE_TEXT",
            "CANNOT_PARSE_ESCAPE_SEQUENCE",
            "CANNOT_PARSE_QUOTED_STRING",
            "CANNOT_PARSE_DATE",
            "CANNOT_PARSE_DATETIME",
            "CANNOT_PARSE_NUMBER",
            "CANNOT_PARSE_DOMAIN_VALUE_FROM_STRING",
            "CANNOT_PARSE_IPV4",
            "CANNOT_PARSE_IPV6",
            "CANNOT_PARSE_INPUT_ASSERTION_FAILED",
            "CANNOT_PARSE_UUID",
            "DUPLICATE_COLUMN",
            "ILLEGAL_COLUMN",
            "UNKNOWN_ELEMENT_IN_AST",
            "UNKNOWN_TYPE_OF_AST_NODE",
            "THERE_IS_NO_COLUMN",
            "TOO_DEEP_AST",
            "TOO_BIG_AST",
            "UNEXPECTED_AST_STRUCTURE",
            "SYNTAX_ERROR",
            "INCORRECT_DATA",
            "TYPE_MISMATCH",
            "VALUE_IS_OUT_OF_RANGE_OF_DATA_TYPE",
        ),
        400,
    ),
    **dict.fromkeys(
        (
            "UNKNOWN_TABLE",
            "UNKNOWN_FUNCTION",
            "UNKNOWN_IDENTIFIER",
            "UNKNOWN_TYPE",
            "UNKNOWN_STORAGE",
            "UNKNOWN_DATABASE",
            "UNKNOWN_SETTING",
            "UNKNOWN_DIRECTION_OF_SORTING",
            "UNKNOWN_AGGREGATE_FUNCTION",
            "UNKNOWN_FORMAT",
            "UNKNOWN_DATABASE_ENGINE",
            "UNKNOWN_TYPE_OF_QUERY",
            "UNKNOWN_ROLE",
        ),
        404,
    ),
    "QUERY_IS_TOO_LARGE": 413,
    "NOT_IMPLEMENTED": 501,
    "SOCKET_TIMEOUT": 503,
    "CANNOT_OPEN_FILE": 503,
    "CANNOT_SCHEDULE_TASK": 503,
    "HTTP_LENGTH_REQUIRED": 411,
    "TIMEOUT_EXCEEDED": 408,
    "UNSUPPORTED_MEDIA_TYPE": 415,
}

_ERROR_RE = re.compile(r"Code: (\d+)\. DB::Exception: .*", re.DOTALL)
_ERROR_NAME_RE = re.compile(r"\(([A-Z][A-Z0-9_]+)\)(?: \(version [^)]*\))?\s*$")
_SETTING_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# `INSERT INTO ... FORMAT <name>` followed by data; VALUES/SELECT inserts are plain queries.
_INSERT_FORMAT_RE = re.compile(
    rb"^\s*INSERT\s+INTO\s+(?:(?!\bVALUES\b|\bSELECT\b|\bWITH\b)[^;])*?\bFORMAT\s+([A-Za-z0-9_]+)",
    re.IGNORECASE | re.DOTALL,
)
_INSERT_SCAN = 64 << 10
_SESSION_STATEMENT_RE = re.compile(rb"^\s*(?:SET|USE)\s", re.IGNORECASE)
_DATABASE = ""  # the current database, kept among a session's setting values
_OUTPUT_FORMAT_RE = re.compile(r"\bFORMAT\s+([A-Za-z0-9_]+)\s*;?\s*$", re.IGNORECASE)
_RESULT_STATEMENT_RE = re.compile(
    r"^\s*(?:\(|SELECT\b|WITH\b|SHOW\b|DESC\b|DESCRIBE\b|EXISTS\b|EXPLAIN\b|CHECK\b)",
    re.IGNORECASE,
)
_TEXT_CONTENT_TYPES = {
    "TabSeparated": "text/tab-separated-values; charset=UTF-8",
    "TSV": "text/tab-separated-values; charset=UTF-8",
    "CSV": "text/csv; charset=UTF-8; header=absent",
    "JSON": "application/json; charset=UTF-8",
    "JSONCompact": "application/json; charset=UTF-8",
    "JSONEachRow": "application/x-ndjson; charset=UTF-8",
}

log = structlog.get_logger("devstack.clickhouse_http")


class ClickHouseError(Exception):
    """A query failed; `text` is ClickHouse's `Code: N. DB::Exception: ... (NAME)` message."""

    def __init__(self, code: int, text: str) -> None:
        super().__init__(text)
        self.code = code
        self.text = text

    @classmethod
    def make(cls, code: int, name: str, message: str) -> ClickHouseError:
        return cls(code, f"Code: {code}. DB::Exception: {message}. ({name})")

    @classmethod
    def from_engine(cls, exc: BaseException) -> ClickHouseError:
        """The engine's error, stripped of chdb's wrapper prefixes."""
        raw = str(exc)
        match = _ERROR_RE.search(raw)
        if match is None:
            return cls.make(1001, "STD_EXCEPTION", raw.strip() or type(exc).__name__)
        return cls(int(match.group(1)), match.group(0).strip())

    @property
    def name(self) -> str:
        match = _ERROR_NAME_RE.search(self.text)
        return match.group(1) if match else ""

    @property
    def http_status(self) -> int:
        return _HTTP_STATUS_BY_NAME.get(self.name, 500)


def decompress_body(data: bytes, encoding: str) -> bytes:
    """Undo `Content-Encoding` (gzip, deflate, zstd, lz4; several concatenated frames allowed)."""
    encoding = encoding.strip().lower()
    try:
        if encoding in ("", "identity"):
            return data
        if encoding in ("gzip", "x-gzip"):
            return gzip.decompress(data)
        if encoding == "deflate":
            return zlib.decompress(data)
        if encoding == "zstd":
            from backports import zstd

            return bytes(zstd.decompress(data))
        if encoding == "lz4":
            return _lz4_frames(data)
    except Exception as exc:
        raise ClickHouseError.make(
            271, "CANNOT_DECOMPRESS", f"Cannot decompress the {encoding} request body: {exc}"
        ) from None
    raise ClickHouseError.make(
        48, "NOT_IMPLEMENTED", f"Content-Encoding {encoding!r} is not supported by this front"
    )


def _lz4_frames(data: bytes) -> bytes:
    import lz4.frame

    parts: list[bytes] = []
    rest = data
    while rest:
        decompressor = lz4.frame.LZ4FrameDecompressor()
        parts.append(decompressor.decompress(rest))
        if not decompressor.eof:
            raise ValueError("truncated lz4 frame")
        rest = decompressor.unused_data
    return b"".join(parts)


@dataclass(frozen=True)
class InsertStatement:
    """`INSERT ... FORMAT <fmt>` split from its data (the statement without `FORMAT`)."""

    sql: str
    fmt: str
    data: memoryview


def split_insert(text: bytes | memoryview) -> InsertStatement | None:
    """The INSERT-with-data in `text`, or None if `text` is an ordinary query.

    Data starts after the format name, its spaces/tabs and at most one line break, as in
    ClickHouse's parser.
    """
    view = memoryview(text)
    head = bytes(view[:_INSERT_SCAN])
    match = _INSERT_FORMAT_RE.match(head)
    if match is None:
        return None
    pos = match.end()
    while pos < len(head) and head[pos] in b" \t\f":
        pos += 1
    if head[pos : pos + 1] == b"\r":
        pos += 1
    if head[pos : pos + 1] == b"\n":
        pos += 1
    sql = head[: match.start(1)].decode("utf-8", errors="replace")
    sql = re.sub(r"\bFORMAT\s*$", "", sql.rstrip(), flags=re.IGNORECASE).rstrip()
    return InsertStatement(sql=sql, fmt=match.group(1).decode("ascii"), data=view[pos:])


def result_format(sql: str, default: str) -> str:
    """The output format a query's result will have: its FORMAT clause or `default`."""
    match = _OUTPUT_FORMAT_RE.search(sql)
    return match.group(1) if match else default


def _quote(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


@dataclass
class Request:
    """One query as the HTTP layer understood it: the `query` parameter and the body."""

    query: bytes
    body: bytes
    params: dict[str, str]
    settings: dict[str, str]
    query_params: dict[str, str]
    database: str | None
    default_format: str
    query_id: str

    def desired(self) -> dict[str, str]:
        """The URL settings and database (key `_DATABASE`) this request runs with."""
        values = dict(self.settings)
        if self.database:
            values[_DATABASE] = self.database
        return values

    def changes_session(self) -> bool:
        """True for SET/USE statements, which change the session's own values."""
        return _SESSION_STATEMENT_RE.match(bytes((self.query or self.body)[:256])) is not None


@dataclass
class Outcome:
    """What a query produced: the body, its format (None for statements without a result)."""

    body: bytes
    fmt: str | None
    summary: dict[str, str]


@dataclass
class _Overlay:
    """A session's own values of the settings requests changed, and the URL values in force.

    URL settings and ``database`` belong to one request. They are left in force after it and
    undone lazily, only where the next request wants something else, so a client that sends
    the same settings every time costs no extra engine round trips. `baseline` holds only
    while no SET/USE runs in the session (those reset the overlay).
    """

    baseline: dict[str, str] = field(default_factory=dict)
    applied: dict[str, str] = field(default_factory=dict)


@dataclass
class _Session:
    conn: Any
    overlay: _Overlay = field(default_factory=_Overlay)
    lock: threading.Lock = field(default_factory=threading.Lock)
    timeout: float = 60.0
    last_used: float = field(default_factory=time.monotonic)
    closed: bool = False


def _connect(dsn: str) -> Any:
    return chdb.connect(dsn)  # type: ignore[no-untyped-call]


class Engine:
    """chdb connections: one per session, a fresh one per sessionless request."""

    def __init__(self, data_path: str) -> None:
        self._dsn = f"{data_path}?{_CONNECTION_SETTINGS}"
        self._base = _connect(self._dsn)  # keeps the engine up between requests
        self._sessions: dict[str, _Session] = {}
        self._sessions_lock = threading.Lock()
        row = self._base.query("SELECT version(), timezone()", "TabSeparated").bytes()
        self.version, self.timezone = row.decode().strip().split("\t")

    def close(self) -> None:
        with self._sessions_lock:
            sessions = list(self._sessions.values())
            self._sessions.clear()
        for session in sessions:
            if session.lock.acquire(timeout=_SESSION_WAIT):
                session.closed = True
                session.conn.close()
        self._base.close()

    def execute(self, request: Request, session_id: str | None, *, check: bool) -> Outcome:
        """Run `request` in its session (or a fresh connection); raises ClickHouseError."""
        if not session_id:
            conn = _connect(self._dsn)
            try:
                self._set(conn, request.desired())
                return self._run(conn, request)
            finally:
                conn.close()
        session = self._locked_session(session_id, request, check=check)
        try:
            if not request.changes_session():
                self._switch(session, request.desired())
                return self._run(session.conn, request)
            # SET/USE change the session's own values: run them on those, forget the baseline.
            self._switch(session, {})
            session.overlay = _Overlay()
            return self._run(session.conn, request)
        finally:
            session.last_used = time.monotonic()
            session.lock.release()

    def _locked_session(self, session_id: str, request: Request, *, check: bool) -> _Session:
        """The session, locked for this request (a session expired meanwhile is replaced)."""
        for _ in range(3):
            session = self._session(session_id, request, check=check)
            if not session.lock.acquire(timeout=_SESSION_WAIT):
                raise ClickHouseError.make(
                    373,
                    "SESSION_IS_LOCKED",
                    f"Session {session_id} is locked by a concurrent client",
                )
            if not session.closed:
                return session
            session.lock.release()
        raise ClickHouseError.make(373, "SESSION_IS_LOCKED", f"Session {session_id} keeps expiring")

    def _session(self, session_id: str, request: Request, *, check: bool) -> _Session:
        raw_timeout = request.params.get("session_timeout") or "60"
        try:
            timeout = float(raw_timeout)
        except ValueError:
            raise ClickHouseError.make(
                36, "BAD_ARGUMENTS", f"Invalid session_timeout: {raw_timeout!r}"
            ) from None
        now = time.monotonic()
        expired: list[tuple[str, _Session]] = []
        with self._sessions_lock:
            session = self._sessions.get(session_id)
            if session is None:
                if check:
                    raise ClickHouseError.make(
                        372, "SESSION_NOT_FOUND", f"Session {session_id} not found"
                    )
                for sid, other in list(self._sessions.items()):
                    idle = now - other.last_used > other.timeout
                    if (idle or len(self._sessions) >= _MAX_SESSIONS) and not other.lock.locked():
                        expired.append((sid, self._sessions.pop(sid)))
                session = _Session(conn=_connect(self._dsn), timeout=timeout)
                self._sessions[session_id] = session
            session.timeout = timeout
        for sid, old in expired:
            if old.lock.acquire(blocking=False):
                old.closed = True
                old.conn.close()
                old.lock.release()
            else:  # a request took it meanwhile: keep it
                with self._sessions_lock:
                    self._sessions.setdefault(sid, old)
        return session

    @staticmethod
    def _query(conn: Any, sql: str, fmt: str = "TabSeparated", **kwargs: Any) -> Any:
        try:
            return conn.query(sql, fmt, **kwargs)
        except Exception as exc:
            raise ClickHouseError.from_engine(exc) from None

    def _switch(self, session: _Session, desired: Mapping[str, str]) -> None:
        """Put exactly `desired` (over the session's own values) in force on the session."""
        overlay = session.overlay
        missing = [name for name in desired if name not in overlay.baseline]
        if missing:
            overlay.baseline.update(self._read(session.conn, missing))
        target = {name: v for name, v in desired.items() if v != overlay.baseline[name]}
        changes = {name: overlay.baseline[name] for name in overlay.applied if name not in target}
        for name, value in target.items():
            if overlay.applied.get(name, overlay.baseline[name]) != value:
                changes[name] = value
        try:
            self._set(session.conn, changes)
        except ClickHouseError:
            self._reset(session, set(changes) | set(overlay.applied))
            raise
        overlay.applied = target

    def _reset(self, session: _Session, names: set[str]) -> None:
        """Best effort back to the session's own values after a failed switch."""
        for name in names:
            with contextlib.suppress(ClickHouseError):
                self._set(session.conn, {name: session.overlay.baseline[name]})
        session.overlay.applied = {}

    def _read(self, conn: Any, names: list[str]) -> dict[str, str]:
        """The current values of settings `names` (`_DATABASE`: the current database)."""
        columns = [
            "currentDatabase()" if name == _DATABASE else f"toString(getSetting({_quote(name)}))"
            for name in names
        ]
        row = self._query(conn, "SELECT " + ", ".join(columns), "JSONCompactEachRow").bytes()
        return dict(zip(names, json.loads(row), strict=True))

    def _set(self, conn: Any, values: Mapping[str, str]) -> None:
        """Make `values` the connection's settings (`_DATABASE`: its current database)."""
        settings = {name: value for name, value in values.items() if name != _DATABASE}
        if settings:
            self._query(conn, "SET " + ", ".join(f"{k} = {_quote(v)}" for k, v in settings.items()))
        if values.get(_DATABASE):
            self._query(conn, f"USE `{values[_DATABASE].replace('`', '``')}`")

    def _run(self, conn: Any, request: Request) -> Outcome:
        insert = split_insert(request.query) if request.query else None
        if insert is not None and not insert.data:
            return self._insert(conn, insert, memoryview(request.body))  # no copy of the data
        # ClickHouse reads the query parameter and the body as one text: query + "\n" + body.
        if request.query and request.body:
            text = request.query + b"\n" + request.body
        else:
            text = request.query or request.body
        insert = split_insert(text)
        if insert is not None:
            return self._insert(conn, insert, insert.data)
        sql = text.decode("utf-8", errors="replace")
        result = self._query(conn, sql, request.default_format, params=request.query_params)
        body = result.bytes()
        fmt = result_format(sql, request.default_format)
        summary = {
            "read_rows": str(result.rows_read()),
            "read_bytes": str(result.bytes_read()),
            "written_rows": str(result.rows_written()),
            "written_bytes": str(result.bytes_written()),
            "elapsed_ns": str(int(result.elapsed() * 1e9)),
        }
        produces = bool(body) or _RESULT_STATEMENT_RE.match(sql) is not None
        return Outcome(body=body, fmt=fmt if produces else None, summary=summary)

    @staticmethod
    def _insert(conn: Any, insert: InsertStatement, data: memoryview) -> Outcome:
        try:
            inserter = conn.send_insert(insert.sql, insert.fmt)
        except Exception as exc:
            raise ClickHouseError.from_engine(exc) from None
        try:
            for start in range(0, len(data), _APPEND_CHUNK):
                inserter.append(bytes(data[start : start + _APPEND_CHUNK]))
            result = inserter.finish()
        except Exception as exc:
            with contextlib.suppress(Exception):
                inserter.cancel()
            raise ClickHouseError.from_engine(exc) from None
        summary = {
            "read_rows": "0",
            "read_bytes": "0",
            "written_rows": str(result.rows_written),
            "written_bytes": str(result.bytes_written),
            "elapsed_ns": str(int(result.elapsed * 1e9)),
        }
        return Outcome(body=b"", fmt=None, summary=summary)


@dataclass(frozen=True)
class Credentials:
    user: str
    password: str

    def check(self, headers: Mapping[str, str], params: Mapping[str, str]) -> None:
        """Raise Code 516 unless the request names this user with this password.

        `headers` has lower-case names.
        """
        user, password = params.get("user"), params.get("password")
        if headers.get("x-clickhouse-user") is not None:
            user, password = headers["x-clickhouse-user"], headers.get("x-clickhouse-key", "")
        auth = headers.get("authorization", "")
        if auth.lower().startswith("basic "):
            try:
                user, _, password = base64.b64decode(auth[6:]).decode().partition(":")
            except ValueError:
                user = password = None
        user = user or "default"
        password = password or ""
        same_user = hmac.compare_digest(user.encode(), self.user.encode())
        same_password = hmac.compare_digest(password.encode(), self.password.encode())
        if not (same_user and same_password):
            raise ClickHouseError.make(
                516,
                "AUTHENTICATION_FAILED",
                f"{user}: Authentication failed: password is incorrect, "
                "or there is no user with such name",
            )


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], engine: Engine, config: ServerConfig) -> None:
        super().__init__(address, _Handler)
        self.engine = engine
        self.config = config
        self.credentials = Credentials(config.user, config.password)
        self.inflight = 0
        self.inflight_cond = threading.Condition()

    @contextlib.contextmanager
    def tracking(self) -> Iterator[None]:
        with self.inflight_cond:
            self.inflight += 1
        try:
            yield
        finally:
            with self.inflight_cond:
                self.inflight -= 1
                self.inflight_cond.notify_all()

    def wait_idle(self, timeout: float) -> None:
        with self.inflight_cond:
            self.inflight_cond.wait_for(lambda: self.inflight == 0, timeout=timeout)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # TCP_NODELAY on every accepted connection
    timeout = 300  # idle keep-alive connections go away
    server: _Server

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        """Requests are logged once, by `_handle`."""

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("http.message", message=format % args)

    def setup(self) -> None:
        super().setup()
        if isinstance(self.connection, ssl.SSLSocket):
            # On the connection's thread (under `timeout`), not the accepting one.
            self.connection.do_handshake()

    def do_GET(self) -> None:
        self._handle()

    def do_POST(self) -> None:
        self._handle()

    def _handle(self) -> None:
        started = time.perf_counter()
        parts = urlsplit(self.path)
        params = dict(parse_qsl(parts.query, keep_blank_values=True))
        query_id = params.get("query_id") or str(uuid.uuid4())
        with self.server.tracking():
            try:
                if parts.path not in ("/", "/ping", "/query"):
                    self._drain_or_close()
                    raise ClickHouseError.make(
                        404, "UNKNOWN_HANDLER", f"No handler for path {parts.path}"
                    )
                if self.command == "GET" and (parts.path == "/ping" or "query" not in params):
                    self._send(200, b"Ok.\n", {"Content-Type": "text/html; charset=UTF-8"})
                    return
                try:
                    self.server.credentials.check(
                        {k.lower(): v for k, v in self.headers.items()}, params
                    )
                except ClickHouseError:
                    self._drain_or_close()
                    raise
                body = decompress_body(self._read_body(), self.headers.get("Content-Encoding", ""))
                outcome = self.server.engine.execute(
                    self._request(params, body, query_id),
                    params.get("session_id") or None,
                    check=params.get("session_check") == "1",
                )
            except ClickHouseError as exc:
                self._send_error(exc, query_id)
                log.debug("http.error", query_id=query_id, code=exc.code)
                return
            except Exception as exc:  # a bug or bad input we did not foresee: answer, go on
                log.warning("http.internal_error", query_id=query_id, error=repr(exc))
                self.close_connection = True
                self._send_error(
                    ClickHouseError.make(1001, "STD_EXCEPTION", f"{type(exc).__name__}: {exc}"),
                    query_id,
                )
                return
            self._send_outcome(outcome, query_id)
            log.debug(
                "http.query",
                query_id=query_id,
                bytes=len(outcome.body),
                written_rows=outcome.summary["written_rows"],
                ms=round((time.perf_counter() - started) * 1000, 2),
            )

    def _request(self, params: dict[str, str], body: bytes, query_id: str) -> Request:
        if params.get("decompress") == "1":
            raise ClickHouseError.make(
                48, "NOT_IMPLEMENTED", "ClickHouse block compression (decompress=1) not supported"
            )
        query = params.get("query", "").encode()
        if not query.strip() and not body.strip():
            raise ClickHouseError.make(62, "SYNTAX_ERROR", "Empty query")
        settings: dict[str, str] = {}
        query_params: dict[str, str] = {}
        for key, value in params.items():
            if key.startswith("param_"):
                query_params[key[len("param_") :]] = value
            elif key not in _HTTP_PARAMS:
                if not _SETTING_NAME_RE.match(key):
                    raise ClickHouseError.make(115, "UNKNOWN_SETTING", f"Bad setting name {key!r}")
                settings[key] = value
        return Request(
            query=query,
            body=body,
            params=params,
            settings=settings,
            query_params=query_params,
            database=params.get("database") or None,
            default_format=params.get("default_format") or "TabSeparated",
            query_id=query_id,
        )

    def _read_body(self) -> bytes:
        limit = self.server.config.max_body_bytes
        if self.headers.get("Content-Type", "").lower().startswith("multipart/"):
            self._drain_or_close()
            raise ClickHouseError.make(
                48, "NOT_IMPLEMENTED", "multipart/form-data requests are not supported"
            )
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            return self._read_chunked(limit)
        length = int(self.headers.get("Content-Length") or 0)
        if length > limit:
            self.close_connection = True
            raise ClickHouseError.make(
                202, "QUERY_IS_TOO_LARGE", f"Request body of {length} bytes exceeds {limit}"
            )
        return self._read_exactly(length)

    def _read_exactly(self, size: int) -> bytes:
        """`size` bytes of the body; a connection that ends early is an error, never a prefix."""
        data = self.rfile.read(size) if size else b""
        if len(data) != size:
            self.close_connection = True
            raise ClickHouseError.make(
                33, "CANNOT_READ_ALL_DATA", f"Request body ended after {len(data)} of {size} bytes"
            )
        return data

    def _read_chunked(self, limit: int) -> bytes:
        chunks: list[bytes] = []
        total = 0
        while True:
            size_line = self.rfile.readline(1024)
            try:
                size = int(size_line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                self.close_connection = True
                raise ClickHouseError.make(
                    27, "CANNOT_PARSE_INPUT_ASSERTION_FAILED", "Malformed chunked request body"
                ) from None
            if size == 0:
                while self.rfile.readline(1024).strip():  # trailers
                    pass
                return b"".join(chunks)
            total += size
            if total > limit:
                self.close_connection = True
                raise ClickHouseError.make(
                    202, "QUERY_IS_TOO_LARGE", f"Chunked request body exceeds {limit} bytes"
                )
            chunks.append(self._read_exactly(size))
            if self.rfile.readline(16).strip():
                self.close_connection = True
                raise ClickHouseError.make(
                    27, "CANNOT_PARSE_INPUT_ASSERTION_FAILED", "Chunk not followed by CRLF"
                )

    def _drain_or_close(self) -> None:
        """Leave the connection usable for the next request, or mark it to close."""
        length = int(self.headers.get("Content-Length") or 0)
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower() or length > 1 << 20:
            self.close_connection = True
        elif length:
            self.rfile.read(length)

    def _common_headers(self, query_id: str) -> dict[str, str]:
        return {
            "X-ClickHouse-Query-Id": query_id,
            "X-ClickHouse-Timezone": self.server.engine.timezone,
            "X-ClickHouse-Server-Display-Name": "hakafka-chdb",
            "Keep-Alive": "timeout=300",
        }

    def _send_outcome(self, outcome: Outcome, query_id: str) -> None:
        headers = self._common_headers(query_id)
        headers["X-ClickHouse-Summary"] = json.dumps(outcome.summary, separators=(",", ":"))
        if outcome.fmt is not None:
            headers["X-ClickHouse-Format"] = outcome.fmt
        headers["Content-Type"] = _TEXT_CONTENT_TYPES.get(
            outcome.fmt or "", "application/octet-stream"
        )
        self._send(200, outcome.body, headers)

    def _send_error(self, exc: ClickHouseError, query_id: str) -> None:
        headers = self._common_headers(query_id)
        headers["X-ClickHouse-Exception-Code"] = str(exc.code)
        headers["Content-Type"] = "text/plain; charset=UTF-8"
        text = exc.text
        if "(version " not in text:
            text = f"{text} (version {self.server.engine.version})"
        self._send(exc.http_status, (text + "\n").encode(), headers)

    def _send(self, status: int, body: bytes, headers: Mapping[str, str]) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)


@dataclass(frozen=True)
class ServerConfig:
    """How the front runs: where it listens, where chdb keeps data, who may query."""

    host: str
    port: int
    data_path: str
    user: str = "default"
    password: str = ""
    max_body_bytes: int = DEFAULT_MAX_BODY
    tls: ServerTls | None = None


def serve(config: ServerConfig) -> int:
    """Serve until SIGTERM/SIGINT; returns the process exit code."""
    try:
        engine = Engine(config.data_path)
    except Exception as exc:
        print(f"clickhouse_http: cannot open chdb data path {config.data_path}: {exc}", flush=True)
        return 2
    try:
        server = _Server((config.host, config.port), engine, config)
        if config.tls is not None:
            server.socket = config.tls.context().wrap_socket(
                server.socket, server_side=True, do_handshake_on_connect=False
            )
    except OSError as exc:
        engine.close()
        print(
            f"clickhouse_http: cannot listen on {config.host}:{config.port} ({exc.strerror}); "
            "stop whatever listens there or choose another port",
            flush=True,
        )
        return 2

    def stop(signum: int, _frame: object) -> None:
        log.info("clickhouse_http.stopping", signal=signal.Signals(signum).name)
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    log.info(
        "clickhouse_http.listening",
        host=config.host,
        port=config.port,
        data_path=config.data_path,
        tls=config.tls is not None,
        engine=engine.version,
        pid=os.getpid(),
    )
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()
        server.wait_idle(timeout=_SESSION_WAIT)
        engine.close()
        log.info("clickhouse_http.stopped")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--data", required=True, help="chdb data path")
    parser.add_argument("--user", default="default")
    parser.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY)
    parser.add_argument("--tls-cert", type=Path, help="PEM certificate chain: serve HTTPS")
    parser.add_argument("--tls-key", type=Path, help="PEM key of --tls-cert")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning"])
    args = parser.parse_args(argv)
    if (args.tls_cert is None) != (args.tls_key is None):
        parser.error("--tls-cert and --tls-key go together")
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso"),
            structlog.processors.KeyValueRenderer(key_order=["timestamp", "level", "event"]),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[args.log_level.upper()]
        ),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stdout),
    )
    config = ServerConfig(
        host=args.host,
        port=args.port,
        data_path=args.data,
        user=args.user,
        password=os.environ.get(PASSWORD_ENV, ""),
        max_body_bytes=args.max_body_bytes,
        tls=None if args.tls_cert is None else ServerTls(args.tls_cert, args.tls_key),
    )
    return serve(config)


if __name__ == "__main__":
    sys.exit(main())
