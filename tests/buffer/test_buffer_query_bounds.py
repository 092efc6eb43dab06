"""Each query is bounded in result bytes, time (encoding included), memory, spill disk and
cores, and its errors are clean: real HTTP and Flight clients against the real servers.

The servers run in a child process (`Served`), so its peak RSS and CPU time are its own,
read from /proc. Every wait is bounded: the child's start, each request, its exit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import quote

import pyarrow.flight as fl
import pytest

from buffer import Catalog, QueryLimits, SqlEngine
from buffer.formats import Format, encode
from buffer.sql import QueryResult, ResultTooLargeError
from hakafka.config import NodeServerConfig, parse_config
from hakafka.settings import query_limits
from tests.fresh import ROOT
from tests.helpers.child_server import ChildServer

WAIT_S = 30.0  # the longest any one request, or the child's start, may take
MIB = 1 << 20

SERVER = """
import json, sys
from buffer import Catalog, QueryLimits, SqlEngine
from buffer.flight import FlightQueryServer
from buffer.http import HttpQueryServer
from buffer.limits import ServerLimits

engine = SqlEngine(Catalog(), QueryLimits(**json.loads(sys.argv[1])))
http = HttpQueryServer(engine, limits=ServerLimits(request_timeout=60))
http.start()
flight = FlightQueryServer(engine)
print(json.dumps({"http": http.url, "flight": flight.location}), flush=True)
sys.stdin.readline()  # until the test closes our stdin
"""


class Served(ChildServer):
    """A child process serving an engine with `limits` over HTTP and Flight, in `cwd`."""

    def __init__(self, limits: QueryLimits, cwd: Path) -> None:
        super().__init__(
            [sys.executable, "-c", SERVER, json.dumps(dataclasses.asdict(limits))],
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            start_s=WAIT_S,
            cwd=cwd,
        )
        self.http: str = self.announced["http"]
        self.flight: str = self.announced["flight"]

    def peak_rss(self) -> int:
        """The child's peak resident set so far (VmHWM), in bytes."""
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        line = next(x for x in status.splitlines() if x.startswith("VmHWM:"))
        return int(line.split()[1]) * 1024

    def cpu_seconds(self) -> float:
        """User + system CPU time the child has used, all its threads."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def get(self, sql: str, fmt: str = "json") -> tuple[int, bytes]:
        """Status and body of GET /query (urllib: a real HTTP client)."""
        url = f"{self.http}/query?format={fmt}&sql={quote(sql)}"
        try:
            with urllib.request.urlopen(url, timeout=WAIT_S) as response:
                return int(response.status), bytes(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, bytes(exc.read())

    def flight_error(self, sql: str) -> fl.FlightError:
        """The Flight error a do_get of `sql` ends with."""
        options = fl.FlightCallOptions(timeout=WAIT_S)
        with fl.connect(self.flight) as client, pytest.raises(fl.FlightError) as err:
            client.do_get(fl.Ticket(sql.encode()), options=options).read_all()
        return err.value


def error(body: bytes) -> tuple[str, str]:
    doc = json.loads(body)
    return doc["error"], doc["message"]


# ~300 MB of result in 2048-row vectors of 2 MB; the issue's query: 600 rows of 1 MB each.
WIDE = "SELECT repeat('x', 1000) AS s FROM range(300000)"
ISSUE = "SELECT repeat('x', 1000000) AS s FROM range(600)"


def test_a_large_result_stops_early_with_the_limit_error_and_bounded_memory(
    tmp_path: Path,
) -> None:
    limits = QueryLimits(max_result_bytes=16 * MIB)
    with Served(limits, tmp_path) as served:
        assert json.loads(served.get("SELECT 42 AS n")[1])["rows"] == [{"n": 42}]
        before = served.peak_rss()
        for fmt in ("json", "csv", "arrow"):
            status, body = served.get(WIDE, fmt)
            kind, message = error(body)
            assert (status, kind) == (413, "result_too_large")
            assert message.startswith("result is over max_result_bytes (16777216 bytes, counted")
        flight = served.flight_error(WIDE)
        assert isinstance(flight, fl.FlightServerError)
        assert flight.extra_info == b"result_too_large"
        assert str(flight).startswith("result is over max_result_bytes (16777216 bytes")
        # The whole result would be ~300 MB (~1.2 GB with its JSON): stopped at ~16 MB.
        assert served.peak_rss() - before < 96 * MIB
        # One DuckDB vector of 600 wide rows comes out whole; the answer is still the error.
        started = time.monotonic()
        status, body = served.get(ISSUE)
        assert (status, error(body)[0]) == (413, "result_too_large")
        assert time.monotonic() - started < 5.0
        assert served.peak_rss() - before < 1024 * MIB  # that vector (572 MB), not its JSON


def test_bytes_are_counted_as_encoded_too() -> None:
    """100 000 BIGINTs are 800 kB of Arrow but ~1.4 MB of JSON: the JSON is refused."""
    engine = SqlEngine(Catalog(), QueryLimits(max_result_bytes=MIB))
    sql = "SELECT range AS a FROM range(100000)"
    try:
        assert engine.query(sql).num_rows == 100_000
        for fmt, fits in ((Format.ARROW, True), (Format.JSON, False)):
            with engine.stream(sql) as result:
                if fits:
                    assert sum(len(c) for c in encode(result, fmt)) < MIB
                    continue
                too_large = r"max_result_bytes \(1048576 bytes, counted encoded\)"
                with pytest.raises(ResultTooLargeError, match=too_large):
                    encode(result, fmt)
    finally:
        engine.close()


def test_the_deadline_covers_encoding(tmp_path: Path) -> None:
    """DuckDB makes these 1M rows in ~0.1 s; JSON-encoding them takes seconds."""
    sql = "SELECT range AS a, range * 1.5 AS b, range::VARCHAR AS c FROM range(1000000)"
    limits = QueryLimits(timeout_s=1.0, max_rows=10**7, max_result_bytes=1 << 30)
    engine = SqlEngine(Catalog(), limits)
    try:
        assert engine.query(sql).num_rows == 1_000_000  # without encoding: within the timeout
    finally:
        engine.close()
    with Served(limits, tmp_path) as served:
        started = time.monotonic()
        status, body = served.get(sql)
        took = time.monotonic() - started
        assert (status, error(body)) == (
            408,
            ("timeout", "query interrupted after the 1.0 s timeout"),
        )
        assert took < 2.0
        assert served.get(sql, "csv")[0] == 200  # CSV is fast enough


def spill_bytes(directory: Path) -> int:
    if not directory.exists():
        return 0
    return sum(f.stat().st_size for f in directory.iterdir() if f.is_file())


# A sort of ~5M rows (~250 MB) with 64 MiB of memory must spill.
SORT = "SELECT range, md5(range::VARCHAR) AS h FROM range(5000000) ORDER BY h"


def test_spill_is_bounded_and_leaves_nothing(tmp_path: Path) -> None:
    spill = tmp_path / "query-spill"
    limits = QueryLimits(
        memory_bytes=64 * MIB, max_spill_bytes=32 * MIB, spill_dir=str(spill), max_rows=10**7
    )
    peak = 0
    stop = threading.Event()

    def watch() -> None:
        nonlocal peak
        while not stop.wait(0.005):
            with contextlib.suppress(FileNotFoundError):  # a file went away while listed
                peak = max(peak, spill_bytes(spill))

    with Served(limits, tmp_path) as served:
        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            status, body = served.get(SORT)
        finally:
            stop.set()
            watcher.join(WAIT_S)
        kind, message = error(body)
        assert (status, kind) == (400, "memory_limit")
        assert message.startswith(
            "query needs more than the engine's memory_bytes (67108864 bytes) with "
            "max_spill_bytes (33554432 bytes) of spill space: Out of Memory Error: "
        )
        assert 0 < peak <= 32 * MIB
        # DuckDB keeps an empty marker of its owner; no spilled data stays.
        assert spill_bytes(spill) == 0
        assert not [f.name for f in spill.iterdir() if f.name.endswith(".tmp")]
    assert not (tmp_path / ".tmp").exists()


def test_spilling_is_off_by_default_and_never_in_the_working_directory(tmp_path: Path) -> None:
    with Served(QueryLimits(memory_bytes=64 * MIB, max_rows=10**7), tmp_path) as served:
        status, body = served.get(SORT)
        assert (status, error(body)[0]) == (400, "memory_limit")
        assert "with no spilling to disk: Out of Memory Error: " in error(body)[1]
        assert list(tmp_path.iterdir()) == []  # no .tmp in the server's working directory


CONFIG = {
    "node": "n1",
    "shards": [0],
    "data_dir": "/srv/hakafka",
    "zookeeper": {"hosts": "zk:2181"},
    "kafka": {"bootstrap": "k:9092"},
    "clickhouse": {"replicas": {"0": {"n1": "ch:8123"}}},
    "pipelines": [{"name": "p", "topic": "t", "table": "p", "columns": {"v": "Int64"}}],
}


def test_server_keys_reach_the_engine_limits() -> None:
    defaults = NodeServerConfig()
    assert (
        defaults.query_timeout,
        defaults.max_result_rows,
        defaults.max_result_bytes,
        defaults.query_memory_bytes,
        defaults.query_threads,
        defaults.max_spill_bytes,
    ) == (10.0, 1_000_000, 64 * MIB, 1 << 30, 1, 0)
    assert query_limits(parse_config(CONFIG)) == QueryLimits()
    server = {
        "query_timeout": 2.5,
        "max_result_rows": 10,
        "max_result_bytes": 4096,
        "query_memory_bytes": 128 * MIB,
        "query_threads": 2,
        "max_spill_bytes": 8 * MIB,
    }
    assert query_limits(parse_config({**CONFIG, "server": server})) == QueryLimits(
        2.5, 10, 4096, 128 * MIB, 2, 8 * MIB, "/srv/hakafka/query-spill"
    )
    with pytest.raises(ValueError, match=r"server.max_spill_bytes: must be >= 0, got -1"):
        parse_config({**CONFIG, "server": {"max_spill_bytes": -1}})
    with pytest.raises(ValueError, match=r"server.query_threads: must be > 0, got 0"):
        parse_config({**CONFIG, "server": {"query_threads": 0}})


def test_one_query_uses_at_most_its_configured_threads(tmp_path: Path) -> None:
    """A CPU-bound query (~2 s on one core) with `query_threads = 1` from the config."""
    limits = query_limits(parse_config({**CONFIG, "server": {"query_timeout": 60.0}}))
    assert limits.threads == 1
    sql = (
        "SELECT count(*) AS n FROM range(20000) a, range(20000) b WHERE (a.range * b.range) % 7 = 1"
    )
    with Served(dataclasses.replace(limits, spill_dir=""), tmp_path) as served:
        assert json.loads(served.get("SELECT current_setting('threads') AS t")[1])["rows"] == [
            {"t": 1}
        ]
        cpu, started = served.cpu_seconds(), time.monotonic()
        status, body = served.get(sql)
        wall, used = time.monotonic() - started, served.cpu_seconds() - cpu
        assert (status, json.loads(body)["rows"]) == (200, [{"n": 48974694}])
        assert wall > 1.0  # long enough to measure
        assert used / wall < 1.2, (used, wall)


def test_flight_errors_carry_no_traceback(tmp_path: Path) -> None:
    with Served(QueryLimits(), tmp_path) as served:
        bad = served.flight_error("SELEC 1")
        assert isinstance(bad, fl.FlightServerError)
        assert bad.extra_info == b"query_error"
        options = fl.FlightCallOptions(timeout=WAIT_S)
        with fl.connect(served.flight) as client, pytest.raises(fl.FlightError) as err:
            client.get_flight_info(fl.FlightDescriptor.for_path("nope"), options)
        for failure in (bad, err.value):
            message = str(failure)
            assert "Traceback" not in message
            assert ".py" not in message and os.sep + "buffer" + os.sep not in message
        assert str(bad).startswith('Parser Error: syntax error at or near "SELEC"')
        assert str(err.value).startswith("no table [b'nope']")


def strict_json(body: bytes) -> object:
    """`body` parsed as JSON proper: Python's parser otherwise accepts NaN and Infinity."""

    def refuse(constant: str) -> object:
        raise ValueError(f"{constant} is not JSON")

    return json.loads(body, parse_constant=refuse)


def test_nan_and_inf_are_null_in_json(tmp_path: Path) -> None:
    sql = (
        "SELECT 'nan'::DOUBLE AS x, 'inf'::DOUBLE AS y, '-inf'::FLOAT AS z, 2.5::DOUBLE AS ok, "
        "[1.5, 'nan'::DOUBLE] AS l, {'a': 'inf'::DOUBLE, 'b': 'x'} AS s, "
        "NULL::DOUBLE AS n"
    )
    with Served(QueryLimits(), tmp_path) as served:
        status, body = served.get(sql)
        assert status == 200
        doc = strict_json(body)
        assert isinstance(doc, dict)
        assert doc["rows"] == [
            {
                "x": None,
                "y": None,
                "z": None,
                "ok": 2.5,
                "l": [1.5, None],
                "s": {"a": None, "b": "x"},
                "n": None,
            }
        ]


def test_a_forwarded_table_is_held_to_the_same_limits() -> None:
    engine = SqlEngine(Catalog(), QueryLimits(max_rows=10**7))
    try:
        table = engine.query("SELECT range AS a FROM range(300000)")  # 2.4 MB
    finally:
        engine.close()
    small = QueryLimits(max_result_bytes=MIB)
    with pytest.raises(ResultTooLargeError, match=r"\(1048576 bytes, counted as Arrow batches\)"):
        encode(QueryResult.of_table(table, small), Format.ARROW)
