"""Fixtures for the buffer tests: a schema with Kafka coordinates, batch factory, servers."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pyarrow as pa
import pytest

from buffer import Catalog, MemoryTable, OffsetRange, QueryLimits, SqlEngine
from buffer.flight import FlightQueryServer
from buffer.http import HttpQueryServer

SCHEMA = pa.schema(
    [
        ("_topic", pa.string()),
        ("_partition", pa.int32()),
        ("_offset", pa.int64()),
        ("kind", pa.string()),
        ("amount", pa.float64()),
    ]
)
KINDS = ("click", "view", "buy")
TOKEN = "s3cret-token"

MakeBatch = Callable[
    [str, int, int, int], tuple[pa.RecordBatch, dict[tuple[str, int], OffsetRange]]
]


@pytest.fixture
def schema() -> pa.Schema:
    return SCHEMA


def make_batch(
    topic: str, partition: int, first: int, rows: int
) -> tuple[pa.RecordBatch, dict[tuple[str, int], OffsetRange]]:
    """Rows for offsets first..first+rows-1 of one partition; kind cycles, amount = offset."""
    offsets = list(range(first, first + rows))
    batch = pa.record_batch(
        {
            "_topic": [topic] * rows,
            "_partition": [partition] * rows,
            "_offset": offsets,
            "kind": [KINDS[o % 3] for o in offsets],
            "amount": [float(o) for o in offsets],
        },
        schema=SCHEMA,
    )
    return batch, {(topic, partition): OffsetRange(first, first + rows - 1)}


@pytest.fixture
def batch_factory() -> MakeBatch:
    return make_batch


@pytest.fixture
def table() -> MemoryTable:
    return MemoryTable("events", SCHEMA, limit_bytes=256 << 20)


@pytest.fixture
def engine(table: MemoryTable) -> Iterator[SqlEngine]:
    """An engine over ``events`` holding offsets 0..999 of ("t", 0) and 0..499 of ("t", 1)."""
    for first in range(0, 1000, 250):
        table.append(*make_batch("t", 0, first, 250))
    table.append(*make_batch("t", 1, 0, 500))
    catalog = Catalog()
    catalog.add(table)
    eng = SqlEngine(catalog, QueryLimits(timeout_s=1.0, max_rows=1200))
    yield eng
    eng.close()


@pytest.fixture
def flight_server(engine: SqlEngine) -> Iterator[FlightQueryServer]:
    server = FlightQueryServer(engine, token=TOKEN)
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    thread.join(timeout=10)


@pytest.fixture
def http_server(engine: SqlEngine) -> Iterator[HttpQueryServer]:
    server = HttpQueryServer(engine, token=TOKEN)
    server.start()
    yield server
    server.close()
