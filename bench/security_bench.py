"""What failing closed costs (#22): the query servers' protections, each next to a raw baseline
measured in the same run.

1. Result path. The 1M-row buffer of bench/buffer_bench.py (`make_batches`), queried as
   `SELECT <its columns> FROM events LIMIT n` for n = 100k and 1M: the engine with its bounds
   on (`SqlEngine.stream`: rows, Arrow bytes and the deadline checked per 2048-row batch),
   then that result encoded as Arrow IPC and as JSON (the encoded bytes counted too), each
   paired with DuckDB alone producing the same Arrow result from the same snapshot
   (`.arrow()`, the floor). Beside them, DuckDB's reader in the engine's 2048-row batches
   with nothing counted (what streaming in small batches costs by itself), and JSON paired
   with a plain `json.dumps` of the floor's rows (the JSON floor), so the encoder's own cost
   shows apart from the bounds'. One DuckDB thread on both sides (the engine's default);
   max_result_bytes raised to 1 GiB, as 1M rows of JSON pass the default 64 MiB.
2. TLS. One server process serving the same engine four ways: HTTP and Flight, plain and TLS
   (`buffer/tls.py`, a throwaway CA and certificate from `devstack/tls.py`), with a token.
   Through `buffer.client.query` (a new connection per query, as `hakafka query` and
   forwarding do, so the TLS handshake is in every query): p50/p99 of `SELECT 42` over the
   four paths interleaved, and the throughput of the whole 1M-row table as Arrow, plain and
   TLS paired: ratio TLS/plain.
3. Refusals. Requests/s a server process answers, one raw-socket connection per request,
   for a POST without token, a Content-Length above max_request_bytes, a negative one and
   a non-numeric one (the body declared is never sent: the refusal must not wait for it),
   each paired with a good GET /health; the process's RSS and threads before and after
   them all (>= 5,000 refused). Then slowloris: SLOWLORIS connections, opened
   SLOWLORIS_PACE_S apart, each sending half a request and holding: how many get 503 at
   once, how many the server drops after request_timeout (REQUEST_TIMEOUT here, to keep
   the run short), and its threads and RSS meanwhile (bounded by max_connections). Last, a
   burst of BURST good requests connecting at once: how long each waits for its answer.
4. The issue's large result, `SELECT repeat('x', 1000000) FROM range(600)` (572 MiB): over
   HTTP, JSON and Arrow, each in a fresh server process: the time to the 413 and the peak
   RSS (VmHWM) under the default limits, next to the same query with the limits raised
   (what it cost before #22).

Servers run in a child process of this script (`--serve`, bound to 127.0.0.1, stopped by its
PID), so their RSS, peak and threads are theirs alone, read from /proc.

Run: PYTHONPATH=. .venv/bin/python bench/security_bench.py [--parts result,tls,refusals,large]
     (about 1.5 minutes)
"""

from __future__ import annotations

import argparse
import dataclasses
import errno
import functools
import http.client
import json
import math
import os
import select
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import duckdb
import pyarrow as pa
from buffer_bench import latencies_ms, make_batches
from pairing import Paired, paired

from buffer import Catalog, MemoryTable, QueryLimits, SqlEngine
from buffer.client import query as client_query
from buffer.flight import FlightQueryServer
from buffer.formats import Format, encode
from buffer.http import HttpQueryServer, Route
from buffer.limits import ServerLimits
from buffer.tls import ClientTls, ServerTls
from devstack.tls import make_certificates
from tests.helpers.child_server import ChildServer

MIB = 1 << 20
ROOT = Path(__file__).resolve().parents[1]
WAIT_S = 30.0  # the longest a server's start, one request or one read may take
TOKEN = "bench-token"
AUTH = f"Authorization: Bearer {TOKEN}\r\n"

RESULT_ROWS = {100_000: 15, 1_000_000: 5}  # rows -> paired rounds (JSON at 1M: JSON_ROUNDS_1M)
JSON_ROUNDS_1M = 3
BATCH_ROWS = 2048  # the batches SqlEngine streams and counts (one DuckDB vector)
RESULT_LIMITS = QueryLimits(timeout_s=120.0, max_result_bytes=1 << 30)

SMALL_SQL = "SELECT 42 AS n"
LARGE_SQL = "SELECT * FROM events"
THROUGHPUT_ROUNDS = 7

REFUSAL_BLOCK = 100  # requests per timed block
REFUSAL_ROUNDS = 13  # 4 kinds x 13 x 100 = 5,200 refused
REQUEST_TIMEOUT = 3.0  # the bench server's request_timeout (default 10 s): slowloris waits it out
SLOWLORIS = 200
SLOWLORIS_PACE_S = 0.002  # connects 2 ms apart: each is accepted before the next
BURST = 64
BURST_LIMIT_S = 10.0  # a connection unanswered by then is counted as such
HALF_REQUEST = b"GET /health HTTP/1.1\r\nHost: x\r\n"  # no blank line: the headers never end
GOOD = "good: GET /health"
REQUESTS = {
    GOOD: ("GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 200),
    "no token (POST /query)": (
        "POST /query HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n",
        401,
    ),
    "Content-Length over the cap": (
        f"POST /query HTTP/1.1\r\nHost: x\r\n{AUTH}Content-Length: {100 * MIB}\r\n\r\n",
        413,
    ),
    "Content-Length: -1": (
        f"POST /query HTTP/1.1\r\nHost: x\r\n{AUTH}Content-Length: -1\r\n\r\n",
        400,
    ),
    "Content-Length: abc": (
        f"POST /query HTTP/1.1\r\nHost: x\r\n{AUTH}Content-Length: abc\r\n\r\n",
        400,
    ),
}

ISSUE_SQL = "SELECT repeat('x', 1000000) AS s FROM range(600)"
RAISED = QueryLimits(timeout_s=120.0, max_result_bytes=4 << 30)
LARGE_BOUNDED_RUNS = 3
FORMATS = ("json", "arrow")


@dataclass(frozen=True)
class ServeSpec:
    """What the child serves: `servers` of http, https, grpc, grpc+tls over one engine with
    `query_limits`, each with `server_limits` and the token; the 1M-row table if `table`;
    `certs` (cert, key) for the TLS ones."""

    servers: tuple[str, ...]
    table: bool = False
    query_limits: QueryLimits = field(default_factory=QueryLimits)
    server_limits: ServerLimits = field(default_factory=ServerLimits)
    certs: tuple[str, str] | None = None

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> ServeSpec:
        doc = json.loads(text)
        return cls(
            servers=tuple(doc["servers"]),
            table=doc["table"],
            query_limits=QueryLimits(**doc["query_limits"]),
            server_limits=ServerLimits(**doc["server_limits"]),
            certs=None if doc["certs"] is None else tuple(doc["certs"]),
        )


def buffered_catalog() -> tuple[Catalog, MemoryTable]:
    """A catalog serving the 1M-row `events` table of the buffer bench."""
    batches = make_batches()
    table = MemoryTable("events", batches[0][0].schema, limit_bytes=1 << 40)
    for batch, ranges in batches:
        table.append(batch, ranges)
    catalog = Catalog()
    catalog.add(table)
    return catalog, table


def serve(spec: ServeSpec) -> None:
    """The child: serve `spec`, print the URLs as one JSON line, stop when stdin closes."""
    catalog = buffered_catalog()[0] if spec.table else Catalog()
    engine = SqlEngine(catalog, spec.query_limits)
    tls = None if spec.certs is None else ServerTls(Path(spec.certs[0]), Path(spec.certs[1]))
    health = Route(lambda: (200, "text/plain", b"ok\n"), public=True)
    https: list[HttpQueryServer] = []
    flights: list[FlightQueryServer] = []
    for scheme in spec.servers:
        secure = tls if scheme in ("https", "grpc+tls") else None
        if scheme.startswith("http"):
            server = HttpQueryServer(
                engine,
                token=TOKEN,
                routes={"/health": health},
                limits=spec.server_limits,
                tls=secure,
            )
            server.start()
            https.append(server)
        else:
            flights.append(
                FlightQueryServer(engine, token=TOKEN, limits=spec.server_limits, tls=secure)
            )
    urls = [s.url for s in https] + [f.location for f in flights]
    print(json.dumps(urls), flush=True)
    sys.stdin.readline()  # until the parent closes our stdin
    for server in https:
        server.close()
    for flight in flights:
        flight.shutdown()
    engine.close()


@dataclass(frozen=True)
class ProcStatus:
    """A process's resident set now and at its peak (VmRSS, VmHWM: bytes), and its threads."""

    rss: int
    peak: int
    threads: int


def proc_status(pid: int) -> ProcStatus:
    """`pid`'s ProcStatus from /proc/<pid>/status."""
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    return ProcStatus(
        int(fields["VmRSS"].split()[0]) * 1024,
        int(fields["VmHWM"].split()[0]) * 1024,
        int(fields["Threads"]),
    )


class Served(ChildServer):
    """A child process serving `spec` (this script with `--serve`); its URLs by scheme."""

    def __init__(self, spec: ServeSpec) -> None:
        path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
        super().__init__(
            [sys.executable, __file__, "--serve", spec.to_json()],
            env={**os.environ, "PYTHONPATH": path},
            start_s=WAIT_S,
        )
        self.urls: dict[str, str] = {url.split("://")[0]: url for url in self.announced}

    def port(self, scheme: str) -> int:
        return int(self.urls[scheme].rsplit(":", 1)[1])

    def status(self) -> ProcStatus:
        return proc_status(self.proc.pid)


def timed(action: Callable[[], object]) -> Callable[[], float]:
    """`action` made to return the seconds it took."""

    def run() -> float:
        started = time.perf_counter()
        action()
        return time.perf_counter() - started

    return run


def mib(nbytes: float) -> str:
    return f"{nbytes / MIB:,.0f} MiB"


def ratio_cell(pairs: Paired) -> str:
    return f"{pairs.ratio():.3f} ({pairs.span()})"


# 1. The result path


@dataclass(frozen=True)
class ResultPath:
    """One way to the answer of `sql`, timed against `base` (a floor) in paired runs."""

    label: str
    base: Callable[[], object]
    subject: Callable[[], object]
    rounds: int


def result_rows() -> list[str]:
    catalog, table = buffered_catalog()
    engine = SqlEngine(catalog, RESULT_LIMITS)
    floor_db = duckdb.connect(":memory:", config={"threads": RESULT_LIMITS.threads})
    snapshot = table.snapshot()
    floor_db.register("events", snapshot.to_table())
    columns = ", ".join(snapshot.schema.names)  # the stored ones: queries may add columns
    lines = [
        f"result path: SELECT <the {len(snapshot.schema)} columns> FROM events LIMIT n over the "
        f"buffer bench's {snapshot.rows:,} rows, {RESULT_LIMITS.threads} DuckDB thread on both "
        f"sides, max_result_bytes {mib(RESULT_LIMITS.max_result_bytes)}; median of paired runs "
        f"({', '.join(f'{n} at {r:,} rows' for r, n in RESULT_ROWS.items())}, JSON at 1M: "
        f"{JSON_ROUNDS_1M}), ratio = subject speed / its floor's (range over the pairs)",
        f"  {'rows':<10} {'path':<50} {'seconds':>8} {'MiB/s':>8}  ratio (range)",
    ]
    try:
        for rows, rounds in RESULT_ROWS.items():
            sql = f"SELECT {columns} FROM events LIMIT {rows}"
            floor = functools.partial(lambda q: floor_db.sql(q).arrow().read_all(), sql)

            def engine_encoded(query: str, fmt: Format) -> list[bytes]:
                with engine.stream(query) as result:
                    return encode(result, fmt)

            def json_floor(query: str) -> bytes:
                return json.dumps(floor_db.sql(query).arrow().read_all().to_pylist()).encode()

            def batched(query: str) -> pa.Table:
                return floor_db.sql(query).to_arrow_reader(batch_size=BATCH_ROWS).read_all()

            expected = floor()
            assert expected.num_rows == rows and engine.query(sql).equals(expected), rows
            json_rounds = JSON_ROUNDS_1M if rows >= 1_000_000 else rounds
            paths = [
                ResultPath(
                    f"DuckDB reader, {BATCH_ROWS}-row batches (no bounds)",
                    floor,
                    functools.partial(batched, sql),
                    rounds,
                ),
                ResultPath(
                    "SqlEngine.stream (bounds checked per batch)",
                    floor,
                    functools.partial(engine.query, sql),
                    rounds,
                ),
                ResultPath(
                    "  + Arrow IPC encoding (bytes counted)",
                    floor,
                    functools.partial(engine_encoded, sql, Format.ARROW),
                    rounds,
                ),
                ResultPath(
                    "  + JSON encoding (bytes counted)",
                    floor,
                    functools.partial(engine_encoded, sql, Format.JSON),
                    json_rounds,
                ),
                ResultPath(
                    "  + JSON encoding, against the JSON floor",
                    functools.partial(json_floor, sql),
                    functools.partial(engine_encoded, sql, Format.JSON),
                    json_rounds,
                ),
            ]
            measured = [(p, paired(timed(p.base), timed(p.subject), p.rounds)) for p in paths]
            floor_s = statistics.median(
                s for p, pairs in measured if p.base is floor for s in pairs.base
            )
            nbytes = expected.nbytes
            floors = [
                ("DuckDB .arrow() (the floor)", floor_s, "1.000"),
                ("json.dumps of its rows (the JSON floor)", measured[-1][1].base_s(), ""),
            ]
            cells = floors + [
                (p.label, pairs.subject_s(), ratio_cell(pairs)) for p, pairs in measured
            ]
            for number, (label, seconds, ratio) in enumerate(cells):
                first = f"{rows:,}" if number == 0 else ""
                lines.append(
                    f"  {first:<10} {label:<50} {seconds:>8.3f} {nbytes / MIB / seconds:>8,.0f}  "
                    f"{ratio}".rstrip()
                )
    finally:
        engine.close()
        floor_db.close()
    lines.append("MiB/s: of the Arrow result (its in-memory bytes), whatever the encoding")
    return lines


# 2. TLS


SCHEMES = {"http": "HTTP", "https": "HTTPS", "grpc": "Flight grpc", "grpc+tls": "Flight grpc+tls"}
PLAIN_AND_TLS = (("http", "https"), ("grpc", "grpc+tls"))


def tls_rows(certs_dir: Path) -> list[str]:
    certs = make_certificates(certs_dir)
    spec = ServeSpec(
        servers=tuple(SCHEMES), table=True, certs=(str(certs.cert_file), str(certs.key_file))
    )
    client_tls = ClientTls(certs.ca_file)
    with Served(spec) as served:

        def ask(scheme: str, sql: str) -> pa.Table:
            tls = client_tls if scheme in ("https", "grpc+tls") else None
            return client_query(served.urls[scheme], sql, TOKEN, WAIT_S, tls=tls)

        paths: dict[str, Callable[[], object]] = {
            scheme: functools.partial(ask, scheme, SMALL_SQL) for scheme in SCHEMES
        }
        for scheme in SCHEMES:
            assert ask(scheme, SMALL_SQL).to_pylist() == [{"n": 42}], scheme
        latency = latencies_ms(paths)
        whole = ask("grpc", LARGE_SQL)
        throughput: dict[str, Paired] = {}
        for plain, secure in PLAIN_AND_TLS:
            assert ask(secure, LARGE_SQL).equals(whole) and ask(plain, LARGE_SQL).equals(whole)
            throughput[secure] = paired(
                timed(functools.partial(ask, plain, LARGE_SQL)),
                timed(functools.partial(ask, secure, LARGE_SQL)),
                THROUGHPUT_ROUNDS,
            )
    nbytes = whole.nbytes
    lines = [
        "TLS: one server process, HTTP and Flight, plain and TLS (TLS 1.2+, an ECDSA P-256 "
        "certificate), with a token; buffer.client.query, a new connection per query",
        f"  {SMALL_SQL}, ms, the 4 paths interleaved     p50      p99  TLS/plain p50",
    ]
    for plain, secure in PLAIN_AND_TLS:
        for scheme in (plain, secure):
            p50, p99 = latency[scheme]
            ratio = f"{p50 / latency[plain][0]:.2f}" if scheme == secure else ""
            lines.append(f"    {SCHEMES[scheme]:<38} {p50:>7.2f} {p99:>8.2f}  {ratio}".rstrip())
    lines.append(
        f"  {LARGE_SQL}: {whole.num_rows:,} rows, {nbytes / MIB:.1f} MiB of Arrow; median of "
        f"{THROUGHPUT_ROUNDS} paired runs, plain first in even ones"
    )
    lines.append(f"    {'':<38} {'seconds':>7} {'MiB/s':>8}  TLS/plain speed (range)")
    for plain, secure in PLAIN_AND_TLS:
        pairs = throughput[secure]
        for scheme, seconds in ((plain, pairs.base_s()), (secure, pairs.subject_s())):
            ratio = ratio_cell(pairs) if scheme == secure else ""
            lines.append(
                f"    {SCHEMES[scheme]:<38} {seconds:>7.3f} {nbytes / MIB / seconds:>8,.0f}  "
                f"{ratio}".rstrip()
            )
    return lines


# 3. Refusals


def ask_raw(port: int, request: bytes) -> bytes:
    """What the server at `port` answers `request` on a fresh connection, read until it closes
    (a reset after the answer ends it too)."""
    data = b""
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT_S) as sock:
        sock.sendall(request)
        try:
            while chunk := sock.recv(65536):
                data += chunk
        except ConnectionResetError:
            pass
    return data


def status_of(answer: bytes) -> int:
    """The status code of an HTTP answer; 0 for none."""
    parts = answer.split(b" ", 2)
    return int(parts[1]) if answer.startswith(b"HTTP/") and len(parts) > 2 else 0


def request_block(port: int, kind: str, count: int) -> float:
    """Seconds `count` requests of REQUESTS[kind] took, one after another, each answered with
    its expected status (else AssertionError)."""
    request, expected = REQUESTS[kind]
    raw = request.encode()
    started = time.perf_counter()
    for _ in range(count):
        answer = ask_raw(port, raw)
        assert status_of(answer) == expected, (kind, answer[:200])
    return time.perf_counter() - started


@dataclass(frozen=True)
class Refusals:
    """Paired blocks of each refusal against the good request, and the server around them."""

    rates: dict[str, Paired]
    start: ProcStatus
    warm: ProcStatus
    end: ProcStatus
    refused: int


def refusal_rates(served: Served, block: int, rounds: int) -> Refusals:
    """Each refusal kind paired with the good request, `rounds` blocks of `block` requests,
    after one warm-up block of each kind."""
    port = served.port("http")
    start = served.status()
    for kind in REQUESTS:
        request_block(port, kind, block)
    # Read once the last handler thread has ended: its client sees the close a moment before.
    warm = settled(served, start.threads)
    good = functools.partial(request_block, port, GOOD, block)
    rates = {
        kind: paired(good, functools.partial(request_block, port, kind, block), rounds)
        for kind in REQUESTS
        if kind != GOOD
    }
    end = settled(served, start.threads)
    return Refusals(rates, start, warm, end, len(rates) * rounds * block)


@dataclass(frozen=True)
class Ended:
    """One connection: what the server answered (b"" for nothing), the seconds from its
    connect until its request was sent (`connect_s`) and from then until the server closed
    it (`answer_s`)."""

    answer: bytes
    connect_s: float
    answer_s: float


@dataclass(frozen=True)
class Driven:
    """The connections of `drive`, by the order they ended; the most threads and the largest
    RSS of the server seen meanwhile (`most.peak`: its VmHWM at the end); `probe`: the
    status of a good /health asked once every connection had sent its request; `unended`:
    the connections still open at the limit (closed by `drive` then)."""

    ended: list[Ended]
    before: ProcStatus
    most: ProcStatus
    probe: int
    unended: int


def drive(served: Served, count: int, request: bytes, pace_s: float, limit_s: float) -> Driven:
    """Open `count` connections to the HTTP server, `pace_s` apart without waiting for any
    (non-blocking connects), send `request` on each as soon as it is connected, and read
    each until the server closes it, or until `limit_s` after the last was opened."""
    port = served.port("http")
    before = served.status()
    most_threads, most_rss = before.threads, before.rss
    connecting: dict[socket.socket, float] = {}
    reading: dict[socket.socket, tuple[float, float, bytes]] = {}  # connect, sent, answer
    ended: list[Ended] = []
    probe = opened = 0
    next_open = time.monotonic()
    deadline = next_open + count * pace_s + limit_s
    try:
        while (opened < count or connecting or reading) and time.monotonic() < deadline:
            now = time.monotonic()
            if opened < count and now >= next_open:
                sock = socket.socket()
                sock.setblocking(False)
                assert sock.connect_ex(("127.0.0.1", port)) in (0, errno.EINPROGRESS)
                connecting[sock], opened, next_open = now, opened + 1, now + pace_s
                continue
            if opened == count and not connecting and not probe:
                probe = status_of(ask_raw(port, REQUESTS[GOOD][0].encode()))
            status = served.status()
            most_threads, most_rss = max(most_threads, status.threads), max(most_rss, status.rss)
            wait = 0.05 if opened == count else min(0.05, max(0.0, next_open - now))
            readable, writable, _ = select.select(list(reading), list(connecting), [], wait)
            for sock in writable:
                error = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                assert error == 0, f"connect failed: {os.strerror(error)}"
                sock.sendall(request)  # a few dozen bytes: the fresh send buffer takes them
                reading[sock] = (connecting.pop(sock), time.monotonic(), b"")
            for sock in readable:
                began, sent, answer = reading[sock]
                try:
                    chunk = sock.recv(65536)
                except ConnectionResetError:
                    chunk = b""
                if chunk:
                    reading[sock] = (began, sent, answer + chunk)
                    continue
                del reading[sock]
                ended.append(Ended(answer, sent - began, time.monotonic() - sent))
                sock.close()
    finally:
        for sock in [*connecting, *reading]:
            sock.close()
    most = ProcStatus(most_rss, served.status().peak, most_threads)
    return Driven(ended, before, most, probe, count - len(ended))


def wait_for_health(port: int) -> int:
    """The status of a good /health, asked until it is 200 or WAIT_S has passed."""
    deadline = time.monotonic() + WAIT_S
    while True:
        status = status_of(ask_raw(port, REQUESTS[GOOD][0].encode()))
        if status == 200 or time.monotonic() > deadline:
            return status
        time.sleep(0.05)


def settled(served: Served, threads: int) -> ProcStatus:
    """The server's status once it is back to at most `threads` threads (its handlers of
    closed connections ending), or after WAIT_S."""
    deadline = time.monotonic() + WAIT_S
    while served.status().threads > threads and time.monotonic() < deadline:
        time.sleep(0.05)
    return served.status()


def refusal_rows() -> list[str]:
    limits = ServerLimits(request_timeout=REQUEST_TIMEOUT)
    good = REQUESTS[GOOD][0].encode()
    with Served(ServeSpec(servers=("http",), server_limits=limits)) as served:
        refusals = refusal_rates(served, REFUSAL_BLOCK, REFUSAL_ROUNDS)
        held = drive(served, SLOWLORIS, HALF_REQUEST, SLOWLORIS_PACE_S, REQUEST_TIMEOUT + WAIT_S)
        health_after = wait_for_health(served.port("http"))
        after = settled(served, held.before.threads)
        burst = drive(served, BURST, good, 0.0, BURST_LIMIT_S)
    good_s = statistics.median(s for p in refusals.rates.values() for s in p.base)
    lines = [
        f"refusals: one connection per request, sequential, blocks of {REFUSAL_BLOCK}; median "
        f"of {REFUSAL_ROUNDS} paired blocks; max_request_bytes {limits.max_request_bytes:,}; "
        "the body declared is never sent",
        f"  {'request':<40} {'answer':>6} {'req/s':>8}  refused/good (range)",
        f"  {GOOD:<40} {REQUESTS[GOOD][1]:>6} {REFUSAL_BLOCK / good_s:>8,.0f}  1.000",
    ]
    for kind, pairs in refusals.rates.items():
        lines.append(
            f"  {kind:<40} {REQUESTS[kind][1]:>6} {REFUSAL_BLOCK / pairs.subject_s():>8,.0f}  "
            f"{ratio_cell(pairs)}"
        )
    start, warm, end = refusals.start, refusals.warm, refusals.end
    lines.append(
        f"  server RSS: {mib(start.rss)} at start, {mib(warm.rss)} after a warm-up block of each, "
        f"{mib(end.rss)} after {refusals.refused:,} refused ({end.rss - warm.rss:+,} bytes, "
        f"{(end.rss - warm.rss) / refusals.refused:+,.0f} per request); threads "
        f"{warm.threads} -> {end.threads}"
    )
    busy = [e for e in held.ended if status_of(e.answer) == 503]
    dropped = [e.answer_s for e in held.ended if e.answer == b""]
    others = [e.answer[:80] for e in held.ended if e.answer and status_of(e.answer) != 503]
    assert not others, f"held connections got answers: {others}"
    drop = f"{min(dropped):.2f}-{max(dropped):.2f} s" if dropped else "-"
    lines += [
        f"slowloris: {SLOWLORIS} connections, one every {SLOWLORIS_PACE_S * 1000:.0f} ms, each "
        f"sending half a GET /health and holding; max_connections {limits.max_connections}, "
        f"request_timeout {limits.request_timeout} s",
        f"  503 at once: {len(busy)}; dropped unanswered by the server: {len(dropped)}, "
        f"{drop} after their half request",
        f"  server threads: {held.before.threads} before, {held.most.threads} at most while "
        f"held, {after.threads} after",
        f"  server RSS: {mib(held.before.rss)} before, {mib(held.most.rss)} at most while held, "
        f"{mib(after.rss)} after",
        f"  a good GET /health while held: {held.probe}; once dropped: {health_after}; "
        f"held connections still open {REQUEST_TIMEOUT + WAIT_S:.0f} s on: {held.unended}",
    ]
    # Unanswered connections count as waiting forever, so the p50 and max do not hide them.
    waits = sorted([e.connect_s + e.answer_s for e in burst.ended] + [math.inf] * burst.unended)
    statuses = sorted({status_of(e.answer) for e in burst.ended})
    late = sum(w >= 1.0 for w in waits) - burst.unended
    lines.append(
        f"burst: {BURST} GET /health connecting at once, answered {statuses}: p50 "
        f"{millis(statistics.median(waits))}, max {millis(waits[-1])}; {late} answered after "
        f"waiting >= 1 s (a SYN over the listen backlog is retried after 1 s, 3 s, ...), "
        f"{burst.unended} not within {BURST_LIMIT_S:.0f} s"
    )
    return lines


def millis(seconds: float) -> str:
    return "never" if math.isinf(seconds) else f"{seconds * 1000:,.0f} ms"


# 4. The issue's large result


@dataclass(frozen=True)
class LargeAnswer:
    """One GET of ISSUE_SQL: status, body bytes, seconds to its last byte, and the server's
    VmHWM just before and after."""

    status: int
    body_bytes: int
    seconds: float
    peak_before: int
    peak_after: int


def get_query(served: Served, sql: str, fmt: str) -> tuple[int, int]:
    """Status and body length of GET /query of `sql` in `fmt`, the body read in 1 MiB pieces
    and dropped (this process holds none of it)."""
    conn = http.client.HTTPConnection("127.0.0.1", served.port("http"), timeout=WAIT_S * 4)
    try:
        conn.request(
            "GET",
            f"/query?format={fmt}&sql={quote(sql)}",
            headers={"Authorization": f"Bearer {TOKEN}"},
        )
        response = conn.getresponse()
        body = 0
        while piece := response.read(MIB):
            body += len(piece)
        return response.status, body
    finally:
        conn.close()


def fetch_large(served: Served, fmt: str) -> LargeAnswer:
    peak_before = served.status().peak
    started = time.perf_counter()
    status, body = get_query(served, ISSUE_SQL, fmt)
    seconds = time.perf_counter() - started
    return LargeAnswer(status, body, seconds, peak_before, served.status().peak)


def size(nbytes: int) -> str:
    return mib(nbytes) if nbytes >= MIB else f"{nbytes:,} B"


def large_rows() -> list[str]:
    cases = {"defaults (after #22)": QueryLimits(), "raised (before #22)": RAISED}
    found: dict[tuple[str, str], list[LargeAnswer]] = {}
    for label, limits in cases.items():
        for fmt in FORMATS:
            runs = 1 if limits is RAISED else LARGE_BOUNDED_RUNS
            with Served(ServeSpec(servers=("http",), query_limits=limits)) as served:
                assert get_query(served, SMALL_SQL, "json")[0] == 200  # warm, before the peak
                found[label, fmt] = [fetch_large(served, fmt) for _ in range(runs)]
    defaults = QueryLimits()
    lines = [
        f"large result: {ISSUE_SQL} over HTTP, a fresh server process per row; defaults: "
        f"max_result_bytes {mib(defaults.max_result_bytes)}, timeout {defaults.timeout_s} s; "
        f"raised: {mib(RAISED.max_result_bytes)}, {RAISED.timeout_s} s",
        f"  {'limits':<22} {'format':<6} {'answer':>6} {'seconds':>8} {'body':>10} "
        f"{'peak RSS':>10} {'peak growth':>12}  raised/defaults (time, growth)",
    ]
    for fmt in FORMATS:
        bounded = found["defaults (after #22)", fmt]
        bounded_s = statistics.median(a.seconds for a in bounded)
        bounded_growth = bounded[-1].peak_after - bounded[0].peak_before
        for label, limits in cases.items():
            answers = found[label, fmt]
            last = answers[-1]
            seconds = statistics.median(a.seconds for a in answers)
            growth = last.peak_after - answers[0].peak_before
            assert {a.status for a in answers} == {200 if limits is RAISED else 413}, answers
            versus = (
                f"{seconds / bounded_s:.1f}x, {growth / bounded_growth:.1f}x"
                if limits is RAISED
                else ""
            )
            lines.append(
                f"  {label:<22} {fmt:<6} {last.status:>6} {seconds:>8.2f} "
                f"{size(last.body_bytes):>10} {mib(last.peak_after):>10} {mib(growth):>12}  "
                f"{versus}".rstrip()
            )
    lines.append(
        f"seconds: to the last byte of the answer (median of {LARGE_BOUNDED_RUNS} under the "
        "defaults, one run raised); peak growth: the server's VmHWM after - before"
    )
    return lines


PARTS = ("result", "tls", "refusals", "large")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default=",".join(PARTS), help="of: " + ",".join(PARTS))
    parser.add_argument("--serve", help=argparse.SUPPRESS)  # the child: a ServeSpec as JSON
    args = parser.parse_args()
    if args.serve is not None:
        serve(ServeSpec.from_json(args.serve))
        return 0
    parts = args.parts.split(",")
    if unknown := [p for p in parts if p not in PARTS]:
        parser.error(f"unknown part(s) {unknown}; known: {', '.join(PARTS)}")
    print(
        f"security bench: pyarrow {pa.__version__}, duckdb {duckdb.__version__}, "
        f"{os.cpu_count()} cores; servers in a child process on 127.0.0.1",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="hakafka-security-bench-") as folder:
        steps: dict[str, Callable[[], list[str]]] = {
            "result": result_rows,
            "tls": functools.partial(tls_rows, Path(folder)),
            "refusals": refusal_rows,
            "large": large_rows,
        }
        for part in parts:
            print(f"... {part}", file=sys.stderr, flush=True)
            print("\n" + "\n".join(steps[part]()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
