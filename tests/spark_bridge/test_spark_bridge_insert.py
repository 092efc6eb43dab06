"""What an insert of a write task sends: its body, one Arrow file, and the settings pinned on
it (`insert_task`): deduplicated and synchronous whatever the user's profile says, one token
per task, so a retried task's rows are dropped. The table side of deduplication:
tests/chlib/test_chlib_table_safety.py."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pytest

from chlib.connection import Connection
from chlib.tables import ensure_table
from devstack.clickhouse import ClickHouseService
from spark_bridge.datasource import arrow_file, insert_settings, insert_task
from spark_bridge.source_options import ClickHouseOptions
from tests.helpers.spark_blocks import spec

# The columns of the batches written here.
COLUMNS = (("v", "Int64"), ("_partition", "Int32"), ("_offset", "Int64"))


def test_every_insert_pins_deduplication_and_synchronous_inserts() -> None:
    assert insert_settings({"deduplicate_insert", "async_insert"}, "p:b:3") == {
        "insert_deduplicate": 1,
        "deduplicate_insert": "enable",
        "async_insert": 0,
        "insert_deduplication_token": "p:b:3",
    }
    # A server older than `deduplicate_insert` would refuse it; no token: content hashes.
    assert insert_settings({"async_insert"}, None) == {"insert_deduplicate": 1, "async_insert": 0}


# --- the ClickHouse front ---------------------------------------------------------------


@dataclass(frozen=True)
class SessionConnection(Connection):
    """A connection whose clients all join one server session: the session's `SET`s stand
    for a user profile's settings."""

    session_id: str = ""

    def client(self, host: str, port: int, database: str | None = None, **kwargs: Any) -> Any:
        return super().client(host, port, database, session_id=self.session_id, **kwargs)


@pytest.fixture
def profile_without_dedup(clickhouse: ClickHouseService, ch_database: str) -> Iterator[Any]:
    """A client in a session where inserts are neither deduplicated nor synchronous, as a
    user profile could set them (the front has one user and no profiles)."""
    session = f"nodedup-{uuid.uuid4().hex}"
    client = clickhouse.client(database=ch_database, session_id=session)
    try:
        # ClickHouse 26 reads `deduplicate_insert` first; older servers only the other two.
        for setting in (
            "deduplicate_insert = 'disable'",
            "insert_deduplicate = 0",
            "async_insert = 1",
        ):
            client.command(f"SET {setting}")
        yield client
    finally:
        client.close()


def row_count(client: Any) -> int:
    return int(client.query("SELECT count() FROM events").result_rows[0][0])


@pytest.mark.integration
def test_pinned_settings_deduplicate_a_retried_insert_even_where_the_profile_does_not(
    clickhouse: ClickHouseService, ch_database: str, profile_without_dedup: Any
) -> None:
    client = profile_without_dedup
    ensure_table(client, spec(ch_database, columns=COLUMNS))
    batch = pa.record_batch(
        {
            "v": pa.array(range(100), pa.int64()),
            "_partition": pa.array([0] * 100, pa.int32()),
            "_offset": pa.array(range(100), pa.int64()),
        }
    )
    # The session really has deduplication off: a token alone does not stop a retry.
    for _ in range(2):
        client.insert_arrow(
            "events", pa.Table.from_batches([batch]), settings={"insert_deduplication_token": "t"}
        )
    assert row_count(client) == 200
    client.command("TRUNCATE TABLE events")

    options = ClickHouseOptions(
        hosts=((clickhouse.host, clickhouse.port),),
        database=ch_database,
        table="events",
        connection=SessionConnection(session_id=client.params["session_id"]),
        token_prefix="pipe:b1",
    )
    first = insert_task(options, 0, [batch])
    retry = insert_task(options, 0, [batch])  # same task, same token: dropped
    assert (first.token, first.rows, retry.token) == ("pipe:b1:0", 100, "pipe:b1:0")
    assert row_count(client) == 100
    insert_task(options, 1, [batch])  # another task's token: a new block
    assert row_count(client) == 200
    profile = client.query(
        "SELECT name, value FROM system.settings"
        " WHERE name IN ('deduplicate_insert', 'insert_deduplicate', 'async_insert')"
    ).result_rows
    assert dict(profile) == {
        "deduplicate_insert": "disable",
        "insert_deduplicate": "0",
        "async_insert": "1",
    }, "the pinned settings held for the inserts only"


@pytest.mark.integration
def test_a_retry_of_the_same_rows_in_other_batches_is_still_dropped(
    clickhouse: ClickHouseService, ch_database: str, ch_client: Any
) -> None:
    # A re-flush rebuilds a task's rows from the WAL: the same rows, the same token, but
    # other Arrow batches than the first attempt (which took them from the buffer).
    ensure_table(ch_client, spec(ch_database, columns=COLUMNS))
    rows = pa.table(
        {
            "v": pa.array(range(100), pa.int64()),
            "_partition": pa.array([0] * 100, pa.int32()),
            "_offset": pa.array(range(100), pa.int64()),
        }
    )
    options = ClickHouseOptions(
        hosts=((clickhouse.host, clickhouse.port),),
        database=ch_database,
        table="events",
        token_prefix="pipe",
    )
    insert_task(options, 0, rows.slice(0, 60).to_batches() + rows.slice(60).to_batches())
    insert_task(options, 0, rows.to_batches())
    insert_task(options, 0, [b for i in range(0, 100, 10) for b in rows.slice(i, 10).to_batches()])
    assert row_count(ch_client) == 100


@pytest.mark.parametrize(
    ("compression", "compressed"), [(None, False), ("lz4", True), ("zstd", True), ("gzip", False)]
)
def test_an_insert_body_is_the_table_as_one_arrow_file(
    compression: str | None, compressed: bool
) -> None:
    table = pa.table({"id": list(range(1000)), "note": ["x" * 50] * 1000})

    body = arrow_file(table, compression)

    reader = pa.ipc.open_file(body)
    assert reader.num_record_batches == 1  # one chunk, as deduplication needs
    assert reader.read_all().equals(table)
    # Arrow compresses its buffers with lz4 and zstd; gzip is HTTP-level, not Arrow's.
    assert (body.size < arrow_file(table, None).size) is compressed
