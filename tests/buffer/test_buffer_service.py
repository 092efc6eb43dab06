"""The Flight and HTTP query services and the client helper, over real sockets."""

from __future__ import annotations

import csv
import io
import json
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import pyarrow as pa
import pyarrow.flight as fl
import pytest

from buffer import MemoryTable, QueryError, SqlEngine
from buffer.client import QueryFailedError, query
from buffer.flight import FlightQueryServer
from buffer.http import HttpQueryServer
from buffer.limits import ServerLimits

TOKEN = "s3cret-token"
GROUP_SQL = (
    "SELECT kind, count(*) AS n FROM events WHERE _partition = 0 GROUP BY kind ORDER BY kind"
)
EXPECTED = [{"kind": "buy", "n": 333}, {"kind": "click", "n": 334}, {"kind": "view", "n": 333}]


def auth_options(token: str | None = TOKEN) -> fl.FlightCallOptions:
    headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
    return fl.FlightCallOptions(headers=headers, timeout=30)


def http_get(
    url: str, token: str | None = TOKEN, accept: str | None = None
) -> tuple[int, str, bytes]:
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    if accept:
        request.add_header("Accept", accept)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.headers["Content-Type"], response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read()


def test_servers_bind_loopback(
    flight_server: FlightQueryServer, http_server: HttpQueryServer
) -> None:
    assert flight_server.location == f"grpc://127.0.0.1:{flight_server.port}"
    assert flight_server.port > 0
    assert http_server.url == f"http://127.0.0.1:{http_server.port}"


def test_flight_do_get_streams_the_result(flight_server: FlightQueryServer) -> None:
    with fl.connect(flight_server.location) as client:
        reader = client.do_get(fl.Ticket(GROUP_SQL.encode()), options=auth_options())
        assert reader.read_all().to_pylist() == EXPECTED
    assert query(flight_server.location, GROUP_SQL, token=TOKEN).to_pylist() == EXPECTED


def test_flight_list_flights_gives_tables_schemas_and_counts(
    flight_server: FlightQueryServer, schema: pa.Schema, table: MemoryTable, batch_factory: Any
) -> None:
    with fl.connect(flight_server.location) as client:
        infos = list(client.list_flights(options=auth_options()))
        assert [i.descriptor.path for i in infos] == [[b"events"]]
        # Queries add `_shard`: the shard of each row (a standalone table is shard 0's).
        assert infos[0].schema.equals(schema.append(pa.field("_shard", pa.int32(), False)))
        assert infos[0].total_records == 1500
        assert infos[0].total_bytes > 0
        ticket = infos[0].endpoints[0].ticket
        assert ticket.ticket == b'SELECT * FROM "events"'
        block = table.seal()
        assert block is not None
        table.commit(block)
        table.append(*batch_factory("t", 0, 1000, 5))
        rows = client.do_get(ticket, options=auth_options()).read_all()
        assert rows.column("_offset").to_pylist() == [1000, 1001, 1002, 1003, 1004]
        info = client.get_flight_info(fl.FlightDescriptor.for_path("events"), auth_options())
        assert info.total_records == 5


def test_flight_requires_the_token(flight_server: FlightQueryServer) -> None:
    with fl.connect(flight_server.location) as client:
        for options in (auth_options(None), auth_options("wrong")):
            with pytest.raises(
                fl.FlightUnauthenticatedError, match="missing or wrong bearer token"
            ):
                client.do_get(fl.Ticket(b"SELECT 1"), options=options).read_all()
            with pytest.raises(fl.FlightUnauthenticatedError):
                list(client.list_flights(options=options))
    with pytest.raises(QueryFailedError, match="missing or wrong bearer token"):
        query(flight_server.location, "SELECT 1")


def engine_message(engine: SqlEngine, sql: str) -> str:
    with pytest.raises(QueryError) as err:
        engine.query(sql)
    return str(err.value)


@pytest.mark.parametrize(
    ("sql", "kind"),
    [
        ("SELEC 1", b"query_error"),
        ("SELECT nope FROM events", b"query_error"),
        ("SELECT * FROM events", b"row_limit"),
    ],
)
def test_flight_bad_sql_and_row_limit_are_server_errors_of_their_kind(
    flight_server: FlightQueryServer, sql: str, kind: bytes
) -> None:
    expected = engine_message(flight_server.engine, sql)
    with fl.connect(flight_server.location) as client, pytest.raises(fl.FlightServerError) as err:
        client.do_get(fl.Ticket(sql.encode()), options=auth_options()).read_all()
    assert err.value.extra_info == kind
    assert str(err.value).startswith(expected + ". Detail: Failed. ")
    with pytest.raises(QueryFailedError) as failed:
        query(flight_server.location, sql, token=TOKEN)
    assert str(failed.value) == expected


def test_flight_errors_carry_the_engine_message(flight_server: FlightQueryServer) -> None:
    with pytest.raises(QueryFailedError, match='syntax error at or near "SELEC"'):
        query(flight_server.location, "SELEC 1", token=TOKEN)
    with pytest.raises(QueryFailedError, match="COPY statements are refused"):
        query(flight_server.location, "COPY events TO '/tmp/x.csv'", token=TOKEN)
    with fl.connect(flight_server.location) as client:
        with pytest.raises(fl.FlightUnauthorizedError, match="refused by the sandbox"):
            client.do_get(
                fl.Ticket(b"SELECT * FROM read_csv('/etc/passwd')"), options=auth_options()
            ).read_all()
        with pytest.raises(fl.FlightTimedOutError, match="timeout"):
            client.do_get(
                fl.Ticket(b"SELECT sum(a.range * b.range) FROM range(200000) a, range(200000) b"),
                options=auth_options(),
            ).read_all()


def test_http_get_json_csv_and_arrow(http_server: HttpQueryServer) -> None:
    base = f"{http_server.url}/query?sql={quote(GROUP_SQL)}"
    status, ctype, body = http_get(base)
    assert (status, ctype) == (200, "application/json")
    doc = json.loads(body)
    assert doc["rows"] == EXPECTED
    assert doc["columns"] == [{"name": "kind", "type": "string"}, {"name": "n", "type": "int64"}]

    status, ctype, body = http_get(base + "&format=csv")
    assert (status, ctype) == (200, "text/csv")
    rows = list(csv.DictReader(io.StringIO(body.decode())))
    assert [(r["kind"], int(r["n"])) for r in rows] == [(e["kind"], e["n"]) for e in EXPECTED]

    status, ctype, body = http_get(base, accept="application/vnd.apache.arrow.stream")
    assert (status, ctype) == (200, "application/vnd.apache.arrow.stream")
    assert pa.ipc.open_stream(body).read_all().to_pylist() == EXPECTED

    status, ctype, _ = http_get(base + "&format=json", accept="text/csv")
    assert ctype == "application/json"  # an explicit format wins over Accept


def test_http_post_raw_and_json_bodies(http_server: HttpQueryServer) -> None:
    assert query(http_server.url, GROUP_SQL, token=TOKEN).to_pylist() == EXPECTED
    request = urllib.request.Request(
        f"{http_server.url}/query",
        data=json.dumps({"sql": GROUP_SQL, "format": "csv"}).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.headers["Content-Type"] == "text/csv"
        assert response.read().decode().splitlines()[1] == '"buy",333'


def test_http_requires_the_token(http_server: HttpQueryServer) -> None:
    url = f"{http_server.url}/query?sql={quote('SELECT count(*) FROM events')}"
    for token in (None, "wrong"):
        status, _, body = http_get(url, token=token)
        assert status == 401
        assert json.loads(body) == {
            "error": "unauthenticated",
            "message": "missing or wrong bearer token",
        }
    with pytest.raises(QueryFailedError, match="missing or wrong bearer token") as err:
        query(http_server.url, "SELECT 1", token="wrong")
    assert err.value.status == 401


def test_http_bad_sql_is_400_with_the_engine_message(http_server: HttpQueryServer) -> None:
    status, ctype, body = http_get(
        f"{http_server.url}/query?sql={quote('SELECT nope FROM events')}"
    )
    assert (status, ctype) == (400, "application/json")
    doc = json.loads(body)
    assert doc["error"] == "query_error"
    assert 'Binder Error: Referenced column "nope" not found in FROM clause' in doc["message"]


@pytest.mark.parametrize(
    ("sql", "status", "kind", "message"),
    [
        ("ATTACH '/tmp/x.db'", 403, "refused", "ATTACH statements are refused"),
        ("INSTALL httpfs", 403, "refused", "INSTALL statements are refused"),
        (
            "SELECT * FROM read_parquet('https://example.com/a.parquet')",
            403,
            "refused",
            "disabled by configuration",
        ),
        (
            "SELECT sum(a.range * b.range) FROM range(200000) a, range(200000) b",
            408,
            "timeout",
            "timeout",
        ),
        ("SELECT * FROM events", 400, "row_limit", "more than 1200 rows"),
    ],
)
def test_http_refusals_have_their_status(
    http_server: HttpQueryServer, sql: str, status: int, kind: str, message: str
) -> None:
    got, _, body = http_get(f"{http_server.url}/query?sql={quote(sql)}")
    doc = json.loads(body)
    assert (got, doc["error"]) == (status, kind)
    assert message in doc["message"]


def test_http_bad_requests(http_server: HttpQueryServer) -> None:
    status, _, body = http_get(f"{http_server.url}/query")
    assert status == 400 and "no SQL" in json.loads(body)["message"]
    status, _, body = http_get(f"{http_server.url}/query?sql=SELECT%201&format=xml")
    assert status == 400 and "unknown format 'xml'" in json.loads(body)["message"]
    status, _, _ = http_get(f"{http_server.url}/other")
    assert status == 404


def test_client_refuses_unknown_scheme() -> None:
    with pytest.raises(ValueError, match="unsupported URL scheme 'ftp'"):
        query("ftp://127.0.0.1:1", "SELECT 1")


def test_http_extra_routes_and_public_paths(engine: SqlEngine) -> None:
    from buffer.http import Route

    routes = {
        "/health": Route(lambda: (200, "text/plain", b"ok\n"), public=True),
        "/status": Route(lambda: (200, "application/json", b'{"role": "leader"}')),
    }
    server = HttpQueryServer(engine, token=TOKEN, routes=routes)
    server.start()
    try:
        assert http_get(f"{server.url}/health", token=None) == (200, "text/plain", b"ok\n")
        assert http_get(f"{server.url}/status", token=None)[0] == 401
        assert http_get(f"{server.url}/status") == (200, "application/json", b'{"role": "leader"}')
        status, _, body = http_get(f"{server.url}/nope")
        assert status == 404
        assert b"/health, /query, /status" in body
    finally:
        server.close()


def test_http_forward_answers_elsewhere(engine: SqlEngine) -> None:
    seen: list[tuple[str, str | None]] = []

    def forward(sql: str, params: Mapping[str, str]) -> pa.Table | None:
        seen.append((sql, params.get("shard")))
        if params.get("shard") == "1":
            return pa.table({"answered_by": ["leader-of-1"]})
        if params.get("shard") == "2":
            raise ConnectionError("leader of shard 2 unreachable")
        return None

    server = HttpQueryServer(engine, forward=forward)
    server.start()
    try:
        sql = quote("SELECT count(*) AS n FROM events")
        status, _, body = http_get(f"{server.url}/query?sql={sql}&shard=1", token=None)
        assert status == 200 and json.loads(body)["rows"] == [{"answered_by": "leader-of-1"}]
        status, _, body = http_get(f"{server.url}/query?sql={sql}", token=None)
        assert status == 200 and json.loads(body)["rows"] == [{"n": 1500}]
        status, _, body = http_get(f"{server.url}/query?sql={sql}&shard=2", token=None)
        assert status == 502 and b"leader of shard 2 unreachable" in body
        assert [s for _, s in seen] == ["1", None, "2"]
    finally:
        server.close()


def test_flight_forward_answers_elsewhere(engine: SqlEngine) -> None:
    answers: list[pa.Table | Exception | None] = [
        pa.table({"answered_by": ["leader"]}),
        None,
        ConnectionError("leader unreachable"),
    ]

    def forward(sql: str, params: Mapping[str, str]) -> pa.Table | None:
        assert params == {}  # a Flight ticket carries only the SQL
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    server = FlightQueryServer(engine, forward=forward)
    try:
        sql = "SELECT count(*) AS n FROM events"
        assert query(server.location, sql).to_pylist() == [{"answered_by": "leader"}]
        assert query(server.location, sql).to_pylist() == [{"n": 1500}]
        with pytest.raises(QueryFailedError, match=r"forward failed: .*leader unreachable"):
            query(server.location, sql)
        assert answers == []
    finally:
        server.shutdown()


def test_both_servers_report_each_query_with_its_protocol_result_and_time(
    engine: SqlEngine,
) -> None:
    # What the daemon counts in hakafka_queries_total and hakafka_query_seconds.
    heard: list[tuple[str, str, float]] = []

    def observe(protocol: str, result: str, seconds: float) -> None:
        heard.append((protocol, result, seconds))

    http = HttpQueryServer(engine, token=TOKEN, observe=observe)
    http.start()
    flight = FlightQueryServer(engine, token=TOKEN, observe=observe)
    try:
        assert http_get(f"{http.url}/query?sql={quote(GROUP_SQL)}")[0] == 200
        assert http_get(f"{http.url}/query?sql={quote('SELECT nope FROM events')}")[0] == 400
        assert http_get(f"{http.url}/query?sql=SELECT%201", token="wrong")[0] == 401
        client = fl.connect(flight.location)
        client.do_get(fl.Ticket(GROUP_SQL.encode()), auth_options()).read_all()
        with pytest.raises(fl.FlightServerError):
            client.do_get(fl.Ticket(b"SELECT nope FROM events"), auth_options()).read_all()
        client.close()
    finally:
        http.close()
        flight.shutdown()
    assert [(protocol, result) for protocol, result, _ in heard] == [
        ("http", "ok"),
        ("http", "query_error"),  # a refused token is not a query: not counted
        ("flight", "ok"),
        ("flight", "query_error"),
    ]
    assert all(0 < seconds < 30 for _, _, seconds in heard)


def test_a_new_token_takes_effect_at_the_next_request(engine: SqlEngine) -> None:
    # What `systemctl reload` does after the token file changed.
    http = HttpQueryServer(engine, token=TOKEN)
    http.start()
    flight = FlightQueryServer(engine, token=TOKEN)
    url = f"{http.url}/query?sql=SELECT%201"
    try:
        http.reconfigure("rotated-token", ServerLimits())
        flight.reconfigure("rotated-token")
        assert http_get(url)[0] == 401
        assert http_get(url, token="rotated-token")[0] == 200
        client = fl.connect(flight.location)
        with pytest.raises(fl.FlightUnauthenticatedError):
            client.do_get(fl.Ticket(b"SELECT 1"), auth_options()).read_all()
        assert client.do_get(fl.Ticket(b"SELECT 1"), auth_options("rotated-token")).read_all()
        client.close()
    finally:
        http.close()
        flight.shutdown()
