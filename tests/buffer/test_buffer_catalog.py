"""One name per pipeline: the tables of every shard a node holds answer as one table with a
`_shard` column; a query for one shard (`shard=`, over HTTP and Flight) reads only that
shard's."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pyarrow as pa
import pytest

from buffer import Catalog, MemoryTable, QueryError, SqlEngine
from buffer.client import QueryFailedError, query
from buffer.flight import FlightQueryServer
from buffer.http import HttpQueryServer
from buffer.sql import shard_of

TOKEN = "catalog-token"
BY_SHARD = "SELECT _shard, count(*) AS n, min(_partition) AS p FROM events GROUP BY 1 ORDER BY 1"


@pytest.fixture
def two_shards(
    engine: SqlEngine, schema: pa.Schema, batch_factory: Any
) -> tuple[SqlEngine, MemoryTable]:
    """The engine's `events` (shard 0: 1500 rows of partitions 0 and 1) and shard 3's
    `events` (20 rows of partition 3)."""
    shard3 = MemoryTable("events", schema, limit_bytes=1 << 20)
    shard3.append(*batch_factory("t", 3, 0, 20))
    engine.catalog.add(shard3, 3)
    return engine, shard3


def test_one_name_covers_every_shard_and_shard_tells_them_apart(
    two_shards: tuple[SqlEngine, MemoryTable],
) -> None:
    engine, _ = two_shards
    assert engine.catalog.names() == ["events"]
    assert engine.query("SELECT count(*) AS n FROM events").to_pylist() == [{"n": 1520}]
    assert engine.query(BY_SHARD).to_pylist() == [
        {"_shard": 0, "n": 1500, "p": 0},
        {"_shard": 3, "n": 20, "p": 3},
    ]
    assert engine.query("SELECT * FROM events LIMIT 0").column_names[-1] == "_shard"
    # A query for one shard reads that shard's tables only; a shard held nowhere has none.
    assert engine.query(BY_SHARD, 3).to_pylist() == [{"_shard": 3, "n": 20, "p": 3}]
    with pytest.raises(QueryError, match="Table with name events does not exist"):
        engine.query(BY_SHARD, 1)


def test_each_shard_holds_a_name_once_and_lets_go_of_its_own(
    two_shards: tuple[SqlEngine, MemoryTable], table: MemoryTable, schema: pa.Schema
) -> None:
    engine, shard3 = two_shards
    again = MemoryTable("events", schema, limit_bytes=1 << 20)
    with pytest.raises(ValueError, match="'events' of shard 3 is already in the catalog"):
        engine.catalog.add(again, 3)
    engine.catalog.discard(again)  # not served: a no-op
    engine.catalog.discard(table)  # shard 0's
    assert engine.query(BY_SHARD).to_pylist() == [{"_shard": 3, "n": 20, "p": 3}]
    engine.catalog.discard(shard3)
    assert engine.catalog.names() == []
    clash = pa.schema([("_shard", pa.int64())])
    with pytest.raises(ValueError, match="has a column '_shard', which queries add"):
        Catalog().add(MemoryTable("clash", clash, limit_bytes=1))


def test_the_shard_parameter_is_a_number_or_refused() -> None:
    assert shard_of({}) is None
    assert shard_of({"shard": "12"}) == 12
    for bad in ("", "-1", "1.0", "x", "1" * 10):
        with pytest.raises(QueryError, match=f"parameter shard={bad!r} is not a shard number"):
            shard_of({"shard": bad})


@pytest.fixture
def servers(
    two_shards: tuple[SqlEngine, MemoryTable],
) -> Iterator[tuple[HttpQueryServer, FlightQueryServer]]:
    engine, _ = two_shards
    http = HttpQueryServer(engine, token=TOKEN)
    http.start()
    flight = FlightQueryServer(engine, token=TOKEN)
    yield http, flight
    http.close()
    flight.shutdown()


def test_http_and_flight_read_one_shard_when_asked(
    servers: tuple[HttpQueryServer, FlightQueryServer],
) -> None:
    http, flight = servers
    for url in (http.url, flight.location):
        assert query(url, BY_SHARD, TOKEN).num_rows == 2, url
        got = query(url, BY_SHARD, TOKEN, shard=3).to_pylist()
        assert got == [{"_shard": 3, "n": 20, "p": 3}], url
        with pytest.raises(QueryFailedError, match="Table with name events does not exist"):
            query(url, BY_SHARD, TOKEN, shard=1)
    request = urllib.request.Request(
        f"{http.url}/query?sql={quote(BY_SHARD)}&shard=x",
        headers={"Authorization": f"Bearer {TOKEN}"},
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 400
    assert json.loads(refused.value.read()) == {
        "error": "query_error",
        "message": "parameter shard='x' is not a shard number",
    }
