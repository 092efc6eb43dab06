"""The ClickHouse HTTP front at the wire: bodies, encodings, formats, settings, auth."""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import gzip
import http.client
import io
import json
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from urllib.parse import urlencode

import lz4.frame
import pyarrow as pa
import pytest
from backports import zstd
from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.exceptions import DatabaseError

from devstack.clickhouse import ClickHouseService
from devstack.clickhouse_http import split_insert

Response = tuple[int, Mapping[str, str], bytes]


def post(
    service: ClickHouseService,
    params: Mapping[str, str],
    body: bytes | Iterator[bytes] = b"",
    headers: Mapping[str, str] | None = None,
) -> Response:
    """One POST; an iterator body is sent chunked."""
    conn = http.client.HTTPConnection(service.host, service.port, timeout=60)
    try:
        conn.request(
            "POST",
            "/?" + urlencode(params),
            body=body,
            headers=dict(headers or {}),
            encode_chunked=not isinstance(body, bytes),
        )
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        conn.close()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            b"INSERT INTO db.t (`a`, `format`) FORMAT Native\n\n\x01rest",
            ("INSERT INTO db.t (`a`, `format`)", "Native", b"\n\x01rest"),
        ),
        (
            b'insert into t settings x=1 format JSONEachRow {"a": 1}',
            ("insert into t settings x=1", "JSONEachRow", b'{"a": 1}'),
        ),
        (b"INSERT INTO t VALUES ('FORMAT Native')", None),
        (b"INSERT INTO t SELECT * FROM s FORMAT Native", None),
        (b"SELECT 1 FORMAT Native", None),
    ],
)
def test_split_insert_finds_data_after_format_name(
    text: bytes, expected: tuple[str, str, bytes] | None
) -> None:
    found = split_insert(text)
    got = None if found is None else (found.sql, found.fmt, bytes(found.data))
    assert got == expected


@pytest.mark.integration
def test_formats_encodings_and_chunked_bodies(
    clickhouse: ClickHouseService, ch_database: str
) -> None:
    db = {"database": ch_database}
    status, _, body = post(
        clickhouse, db, b"CREATE TABLE t (id UInt64, s String) ENGINE = MergeTree ORDER BY id"
    )
    assert status == 200, body

    rows = b"".join(b'{"id": %d, "s": "j%d"}\n' % (i, i) for i in range(100))
    cases: list[tuple[str, Mapping[str, str], bytes | Iterator[bytes]]] = [
        ("plain", {}, rows),
        ("gzip", {"Content-Encoding": "gzip"}, gzip.compress(rows)),
        ("zstd", {"Content-Encoding": "zstd"}, zstd.compress(rows[:50]) + zstd.compress(rows[50:])),
        (
            "lz4",
            {"Content-Encoding": "lz4"},
            lz4.frame.compress(rows[:70]) + lz4.frame.compress(rows[70:]),
        ),
        ("chunked", {}, iter([rows[:33], rows[33:34], rows[34:]])),
    ]
    for name, headers, payload in cases:
        params = {**db, "query": "INSERT INTO t FORMAT JSONEachRow"}
        status, resp_headers, body = post(clickhouse, params, payload, headers)
        assert status == 200, (name, body)
        assert json.loads(resp_headers["X-ClickHouse-Summary"])["written_rows"] == "100", name
    # The whole statement in the body, data after it.
    status, _, body = post(clickhouse, db, b"INSERT INTO t FORMAT JSONEachRow\n" + rows)
    assert status == 200, body

    status, headers, body = post(
        clickhouse,
        {**db, "query": "SELECT count(), uniqExact(id), sum(id) FROM t FORMAT TabSeparated"},
    )
    assert (status, body) == (200, b"600\t100\t29700\n")
    assert headers["X-ClickHouse-Format"] == "TabSeparated"
    assert headers["X-ClickHouse-Timezone"]

    # RowBinary and ArrowStream out of the engine go back in unchanged.
    for fmt in ("RowBinary", "ArrowStream", "Native"):
        status, _, data = post(
            clickhouse, {**db, "query": f"SELECT * FROM t WHERE id < 10 FORMAT {fmt}"}
        )
        assert status == 200
        status, _, body = post(clickhouse, {**db, "query": f"INSERT INTO t FORMAT {fmt}"}, data)
        assert status == 200, (fmt, body)
    # 6 inserts put 60 rows with id < 10 in; each of the 3 round trips doubles them.
    status, _, body = post(clickhouse, {**db, "query": "SELECT count() FROM t WHERE id < 10"})
    assert body == b"480\n"

    # param_* query parameters and the query split between URL and body.
    status, _, body = post(
        clickhouse,
        {**db, "query": "SELECT s FROM t WHERE id = {id:UInt64}", "param_id": "42"},
        b"LIMIT 1",
    )
    assert (status, body) == (200, b"j42\n")

    # Bad input gets a ClickHouse error, and the server goes on.
    status, headers, body = post(
        clickhouse, {"query": "SELECT 1", "session_id": "s", "session_timeout": "x"}
    )
    assert (status, headers["X-ClickHouse-Exception-Code"]) == (400, "36")
    status, headers, body = post(
        clickhouse, {"query": "SELECT 1"}, b"x", {"Content-Encoding": "br"}
    )
    assert (status, headers["X-ClickHouse-Exception-Code"]) == (501, "48")
    status, headers, body = post(clickhouse, db, b'INSERT INTO t FORMAT JSONEachRow\n{"id": "x"}')
    assert status == 400
    assert body.startswith(b"Code: ")
    assert post(clickhouse, {"query": "SELECT 2"})[2] == b"2\n"


@pytest.mark.integration
def test_truncated_body_inserts_nothing(clickhouse: ClickHouseService, ch_client: Client) -> None:
    ch_client.command("CREATE TABLE t (id UInt64) ENGINE = MergeTree ORDER BY id")
    data = ch_client.raw_query("SELECT number FROM numbers(1000)", fmt="RowBinary")
    conn = http.client.HTTPConnection(clickhouse.host, clickhouse.port, timeout=30)
    query = urlencode({"database": ch_client.database, "query": "INSERT INTO t FORMAT RowBinary"})
    conn.putrequest("POST", "/?" + query)
    conn.putheader("Content-Length", str(len(data)))
    conn.endheaders()
    conn.send(data[: len(data) // 2])
    assert conn.sock is not None
    conn.sock.shutdown(1)  # the client goes away mid-body
    resp = conn.getresponse()
    assert resp.status == 500
    assert resp.getheader("X-ClickHouse-Exception-Code") == "33"
    conn.close()
    assert ch_client.command("SELECT count() FROM t") == 0


@pytest.mark.integration
def test_url_settings_do_not_leak_into_the_session(ch_client: Client) -> None:
    def threads(**settings: int) -> int:
        sql = "SELECT value FROM system.settings WHERE name = 'max_threads'"
        value = ch_client.command(sql, settings=settings)
        assert isinstance(value, int)
        return value

    ch_client.command("SET max_threads = 1")
    assert threads(max_threads=2) == 2
    assert threads() == 1
    assert threads(max_threads=2) == 2
    ch_client.command("SET max_threads = 3")  # lands on the session's own value
    assert threads() == 3
    assert threads(max_threads=2) == 2
    assert threads(max_threads=5) == 5
    assert threads() == 3

    db = ch_client.database
    assert ch_client.command("SELECT currentDatabase()", settings={"database": "system"}) == (
        "system"
    )
    assert ch_client.command("SELECT currentDatabase()") == db
    with pytest.raises(DatabaseError) as unknown:
        ch_client.command("SELECT 1", settings={"no_such_setting_at_all": 1})
    assert "Code: 115" in str(unknown.value)
    assert "no_such_setting_at_all" in str(unknown.value)
    assert threads() == 3


@pytest.mark.integration
def test_native_insert_dedup_and_types(ch_client: Client) -> None:
    ch_client.command(
        "CREATE TABLE typed (id UInt32, lc LowCardinality(String), n Nullable(Int64), "
        "ts DateTime64(3, 'UTC'), d Date, arr Array(String), m Map(String, UInt8), "
        "dec Decimal(18, 4), u UUID) ENGINE = MergeTree ORDER BY id "
        "SETTINGS non_replicated_deduplication_window = 100"
    )
    when = dt.datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=dt.UTC)
    ident = uuid.UUID(int=7)
    rows = [
        [
            1,
            "a",
            None,
            when,
            dt.date(2026, 1, 2),
            ["x", "y"],
            {"k": 1},
            decimal.Decimal("1.5"),
            ident,
        ],
        [2, "b", -5, when, dt.date(2026, 1, 3), [], {}, decimal.Decimal("-2.25"), ident],
    ]
    names = ["id", "lc", "n", "ts", "d", "arr", "m", "dec", "u"]
    token = {"insert_deduplication_token": "native:1"}
    ch_client.insert("typed", rows, column_names=names, settings=token)
    ch_client.insert("typed", rows, column_names=names, settings=token)
    back = ch_client.query("SELECT * FROM typed ORDER BY id").result_rows
    # clickhouse-connect returns naive datetimes for a UTC server.
    rows[0][3] = rows[1][3] = when.replace(tzinfo=None)
    assert [list(r) for r in back] == rows
    table = ch_client.query_arrow("SELECT id, lc FROM typed ORDER BY id")
    assert table.column("lc").to_pylist() == ["a", "b"]


@pytest.mark.integration
def test_credentials_in_every_form(tmp_path: Path) -> None:
    service = ClickHouseService(tmp_path / "ch", user="ingest", password="s3cret")
    service.start()
    try:
        select = {"query": "SELECT 1"}
        basic = base64.b64encode(b"ingest:s3cret").decode()
        accepted = [
            post(service, select, headers={"Authorization": f"Basic {basic}"}),
            post(
                service,
                select,
                headers={"X-ClickHouse-User": "ingest", "X-ClickHouse-Key": "s3cret"},
            ),
            post(service, {**select, "user": "ingest", "password": "s3cret"}),
        ]
        assert [(s, b) for s, _, b in accepted] == [(200, b"1\n")] * 3
        for status, headers, body in (
            post(service, select),
            post(
                service, select, headers={"X-ClickHouse-User": "ingest", "X-ClickHouse-Key": "no"}
            ),
            post(service, {**select, "user": "default", "password": "s3cret"}),
        ):
            assert (status, headers["X-ClickHouse-Exception-Code"]) == (403, "516")
            assert body.startswith(b"Code: 516. DB::Exception:")
        assert post(service, {"query": "SELECT 1"})[0] == 403
        conn = http.client.HTTPConnection(service.host, service.port, timeout=10)
        conn.request("GET", "/ping")
        assert conn.getresponse().read() == b"Ok.\n"
        conn.close()
    finally:
        service.stop()
    assert "s3cret" not in service.log_path.read_text()


@pytest.mark.integration
def test_arrow_file_with_many_batches_is_one_block(ch_client: Client) -> None:
    ch_client.command(
        "CREATE TABLE b (id UInt64) ENGINE = MergeTree ORDER BY id "
        "SETTINGS non_replicated_deduplication_window = 100"
    )
    table = pa.table({"id": pa.array(range(50_000), pa.uint64())})
    sink = io.BytesIO()
    with pa.ipc.new_file(sink, table.schema) as writer:
        for batch in table.to_batches(max_chunksize=1_000):
            writer.write_batch(batch)
    for _ in range(2):  # the retry is dropped as a whole
        ch_client.raw_insert(
            "b", ["id"], sink.getvalue(), fmt="Arrow", settings={"insert_deduplication_token": "t"}
        )
    assert ch_client.command("SELECT count(), count(DISTINCT _part) FROM b") == ["50000", "1"]
