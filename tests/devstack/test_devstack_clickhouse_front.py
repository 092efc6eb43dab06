"""The ClickHouse HTTP front (chdb behind the HTTP interface) driven by clickhouse-connect."""

from __future__ import annotations

import socket
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa
import pytest
from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.exceptions import DatabaseError

from devstack.clickhouse import ClickHouseService
from devstack.process import DevstackError

pytestmark = pytest.mark.integration


def _events(n: int, start: int = 0) -> pa.Table:
    ids = pa.array(range(start, start + n), pa.uint64())
    return pa.table(
        {
            "id": ids,
            "name": pa.array([f"n{i}" for i in range(start, start + n)]),
            "value": pa.array([i * 0.5 for i in range(start, start + n)], pa.float64()),
        }
    )


def test_client_query_insert_command_error_and_session(ch_client: Client, ch_database: str) -> None:
    ch_client.command(
        "CREATE TABLE t (id UInt64, name String, value Float64) ENGINE = MergeTree ORDER BY id"
    )
    summary = ch_client.insert(
        "t", [[1, "a", 1.5], [2, "b", 2.5]], column_names=["id", "name", "value"]
    )
    assert summary.written_rows == 2
    ch_client.insert_arrow("t", _events(3, start=10))

    result = ch_client.query("SELECT id, name, value FROM t ORDER BY id")
    assert result.result_rows == [
        (1, "a", 1.5),
        (2, "b", 2.5),
        (10, "n10", 5.0),
        (11, "n11", 5.5),
        (12, "n12", 6.0),
    ]
    bound = ch_client.query("SELECT name FROM t WHERE id = {id:UInt64}", parameters={"id": 11})
    assert bound.result_rows == [("n11",)]

    table = ch_client.query_arrow("SELECT id, name FROM t WHERE id >= 10 ORDER BY id")
    assert table.column("id").to_pylist() == [10, 11, 12]
    assert table.column("name").to_pylist() == ["n10", "n11", "n12"]

    assert ch_client.command("SELECT count() FROM t") == 5
    assert ch_client.command("SELECT currentDatabase()") == ch_database

    with pytest.raises(DatabaseError) as missing:
        ch_client.query("SELECT * FROM no_such_table")
    assert "Code: 60" in str(missing.value)
    assert "UNKNOWN_TABLE" in str(missing.value)
    with pytest.raises(DatabaseError) as syntax:
        ch_client.command("SELEC 1")
    assert "Code: 62" in str(syntax.value)

    # A temporary table lives in the client's session, across requests.
    ch_client.command("CREATE TEMPORARY TABLE tmp (x UInt8)")
    ch_client.command("INSERT INTO tmp VALUES (7), (8)")
    assert ch_client.command("SELECT sum(x) FROM tmp") == 15


def test_error_status_codes_and_headers(clickhouse: ClickHouseService) -> None:
    import urllib.error
    import urllib.request

    def status_of(sql: str) -> tuple[int, str, str]:
        req = urllib.request.Request(clickhouse.url + "/", data=sql.encode(), method="POST")
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, resp.headers.get("X-ClickHouse-Exception-Code", ""), ""
        except urllib.error.HTTPError as exc:
            body = exc.read().decode()
            return exc.code, exc.headers.get("X-ClickHouse-Exception-Code", ""), body

    assert status_of("SELECT * FROM no_such_table_anywhere")[:2] == (404, "60")
    status, code, body = status_of("SELEC 1")
    assert (status, code) == (400, "62")
    assert body.startswith("Code: 62. DB::Exception: Syntax error")
    assert status_of("SELECT 1")[:2] == (200, "")


def test_dedup_token_on_100k_arrow_rows(ch_client: Client) -> None:
    ch_client.command(
        "CREATE TABLE events (id UInt64, name String, value Float64) ENGINE = MergeTree "
        "ORDER BY id SETTINGS non_replicated_deduplication_window = 1000"
    )
    rows = _events(100_000)
    ch_client.insert_arrow("events", rows, settings={"insert_deduplication_token": "blk:1"})
    back = ch_client.query_arrow("SELECT id, name, value FROM events ORDER BY id")
    assert back.num_rows == 100_000
    assert back.column("id").to_pylist() == rows.column("id").to_pylist()
    assert back.column("name").to_pylist() == rows.column("name").to_pylist()
    # One request is one block: one part.
    assert ch_client.command("SELECT count(DISTINCT _part) FROM events") == 1

    # A retry with the same token is dropped, even with different rows...
    ch_client.insert_arrow("events", _events(5), settings={"insert_deduplication_token": "blk:1"})
    assert ch_client.command("SELECT count() FROM events") == 100_000
    # ...a new token is kept, even for identical rows.
    ch_client.insert_arrow("events", rows, settings={"insert_deduplication_token": "blk:2"})
    assert ch_client.command("SELECT count() FROM events") == 200_000
    # The token did not stick to the session: a later insert without one is kept.
    ch_client.insert_arrow("events", _events(3, start=500_000))
    assert ch_client.command("SELECT count() FROM events") == 200_003


def test_port_in_use_is_a_one_line_error(tmp_path: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        service = ClickHouseService(tmp_path / "ch", port=port)
        with pytest.raises(DevstackError) as err:
            service.start(timeout=10)
    message = str(err.value)
    assert "\n" not in message
    assert f"port {port}" in message
    assert "stop whatever listens there or choose another port" in message
    assert service.pid is None


def test_restart_keeps_data_and_checks_password(tmp_path: Path) -> None:
    secret = uuid.uuid4().hex
    service = ClickHouseService(tmp_path / "ch", user="ingest", password=secret)
    service.start()
    try:
        client = service.client()
        client.command(
            "CREATE TABLE kept (x UInt32) ENGINE = MergeTree ORDER BY x "
            "SETTINGS non_replicated_deduplication_window = 100"
        )
        token = {"insert_deduplication_token": "before-restart"}
        client.insert("kept", [[1], [2], [3]], column_names=["x"], settings=token)
        port, first_pid = service.port, service.pid
        service.stop()
        assert service.pid is None
        assert not service.healthy()
        service.start()
        assert service.port == port
        assert service.pid != first_pid
        client = service.client()
        assert client.command("SELECT sum(x) FROM kept") == 6
        # The deduplication window survives the restart: a late retry is still dropped.
        client.insert("kept", [[1], [2], [3]], column_names=["x"], settings=token)
        assert client.command("SELECT sum(x) FROM kept") == 6

        service.kill()  # and after a crash
        assert service.pid is None
        service.start()
        client = service.client()
        client.insert("kept", [[1], [2], [3]], column_names=["x"], settings=token)
        assert client.command("SELECT sum(x) FROM kept") == 6

        with pytest.raises(DatabaseError) as denied:
            service.client(password="wrong")
        assert "Code: 516" in str(denied.value)
        assert secret not in service.log_path.read_text()
    finally:
        service.stop()


def test_parallel_clients_insert_with_tokens(
    clickhouse: ClickHouseService, ch_database: str
) -> None:
    admin = clickhouse.client(database=ch_database)
    admin.command(
        "CREATE TABLE par (w UInt8, i UInt32, id UInt64) ENGINE = MergeTree ORDER BY (w, i, id) "
        "SETTINGS non_replicated_deduplication_window = 1000"
    )

    def worker(w: int) -> None:
        client = clickhouse.client(database=ch_database)
        try:
            for i in range(4):
                block = pa.table(
                    {
                        "w": pa.array([w] * 5_000, pa.uint8()),
                        "i": pa.array([i] * 5_000, pa.uint32()),
                        "id": pa.array(range(5_000), pa.uint64()),
                    }
                )
                for _attempt in range(2):  # every block is sent twice, as after a failover
                    client.insert_arrow(
                        "par", block, settings={"insert_deduplication_token": f"{w}:{i}"}
                    )
        finally:
            client.close()

    with ThreadPoolExecutor(max_workers=4) as pool:
        for done in [pool.submit(worker, w) for w in range(4)]:
            done.result(timeout=240)
    assert admin.command("SELECT count(), uniqExact(w, i, id) FROM par") == ["80000", "80000"]
    admin.close()
