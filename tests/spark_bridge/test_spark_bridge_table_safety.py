"""ClickHouse's deduplication prerequisites: the engine and window of an existing table
(`ensure_table` refuses what would not deduplicate a re-flush, with the fix) and the settings
pinned on every insert. Decisions are unit-tested; the rest runs on the ClickHouse front."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pytest

from devstack.clickhouse import ClickHouseService
from spark_bridge.connection import Connection
from spark_bridge.datasource import insert_settings, insert_task
from spark_bridge.source_options import ClickHouseOptions
from spark_bridge.tables import (
    Engine,
    TableDedup,
    TableSpec,
    UnsafeTableError,
    check_dedup,
    check_one_table,
    dedup_kind,
    default_window,
    engine_settings,
    ensure_table,
    table_uuid,
)

COLUMNS = (("v", "Int64"), ("_partition", "Int32"), ("_offset", "Int64"))
COLUMNS_SQL = "(v Int64, _partition Int32, _offset Int64)"
ALTER_EVENTS = "ALTER TABLE `db`.`events` MODIFY SETTING"


def spec(
    database: str = "db",
    engine: Engine = Engine.MERGE_TREE,
    dedup_window: int = 10_000,
) -> TableSpec:
    return TableSpec(
        database,
        "events",
        COLUMNS,
        order_by="(_partition, _offset)",
        engine=engine,
        dedup_window=dedup_window,
    )


def refusal(table_spec: TableSpec, dedup: TableDedup) -> str:
    error = check_dedup(table_spec, dedup)
    assert error is not None, f"{dedup} was accepted for {table_spec}"
    return str(error)


# --- decisions (no ClickHouse) ---------------------------------------------------------


def test_engine_settings_come_from_the_trailing_clause_only() -> None:
    full = (
        "ReplicatedMergeTree('/clickhouse/SETTINGS/{shard}/t', '{replica}') ORDER BY `SETTINGS`"
        " SETTINGS replicated_deduplication_window = 100, storage_policy = 'a, b = c',"
        " index_granularity = 8192"
    )
    assert engine_settings(full) == {
        "replicated_deduplication_window": "100",
        "storage_policy": "'a, b = c'",
        "index_granularity": "8192",
    }
    assert engine_settings("Log") == {}
    assert engine_settings("MergeTree ORDER BY tuple() TTL d + toIntervalDay(1)") == {}


@pytest.mark.parametrize(
    ("engine", "kind"),
    [
        ("MergeTree", Engine.MERGE_TREE),
        ("ReplacingMergeTree", Engine.MERGE_TREE),
        ("SummingMergeTree", Engine.MERGE_TREE),
        ("ReplicatedMergeTree", Engine.REPLICATED_MERGE_TREE),
        ("ReplicatedReplacingMergeTree", Engine.REPLICATED_MERGE_TREE),
        ("SharedMergeTree", Engine.REPLICATED_MERGE_TREE),
        ("Log", None),
        ("Memory", None),
        ("Distributed", None),
        ("MaterializedView", None),
    ],
)
def test_only_mergetree_engines_deduplicate_and_replicated_ones_share_the_log(
    engine: str, kind: Engine | None
) -> None:
    assert dedup_kind(engine) is kind


def test_a_window_of_zero_is_refused_with_the_alter_that_fixes_it() -> None:
    default = refusal(spec(), TableDedup("MergeTree", Engine.MERGE_TREE, 0))
    assert default == (
        "table db.events would not deduplicate re-flushed inserts: "
        "non_replicated_deduplication_window = 0 (the server's default) deduplicates nothing; "
        f"fix: {ALTER_EVENTS} non_replicated_deduplication_window = 10000"
    )
    own = refusal(spec(), TableDedup("MergeTree", Engine.MERGE_TREE, 0, window_on_table=True))
    assert "non_replicated_deduplication_window = 0 (set on the table)" in own


def test_a_window_below_the_configured_one_is_refused() -> None:
    message = refusal(
        spec(engine=Engine.REPLICATED_MERGE_TREE),
        TableDedup("ReplicatedMergeTree", Engine.REPLICATED_MERGE_TREE, 1000),
    )
    assert "replicated_deduplication_window = 1000 (the server's default) is below" in message
    assert f"fix: {ALTER_EVENTS} replicated_deduplication_window = 10000" in message


def test_a_window_at_least_the_configured_one_on_any_mergetree_engine_is_accepted() -> None:
    assert check_dedup(spec(), TableDedup("MergeTree", Engine.MERGE_TREE, 10_000)) is None
    replacing = TableDedup("ReplacingMergeTree", Engine.MERGE_TREE, 20_000, window_on_table=True)
    assert check_dedup(spec(), replacing) is None
    replicated = TableDedup("ReplicatedSummingMergeTree", Engine.REPLICATED_MERGE_TREE, 10_000)
    assert check_dedup(spec(engine=Engine.REPLICATED_MERGE_TREE), replicated) is None


def test_an_engine_that_keeps_no_token_log_is_refused() -> None:
    message = refusal(spec(), TableDedup("Log", None))
    assert message == (
        "table db.events would not deduplicate re-flushed inserts: engine Log does not "
        "deduplicate inserts (only MergeTree-family engines do); fix: rename or drop "
        "`db`.`events`, then hakafka creates it as MergeTree with "
        "non_replicated_deduplication_window = 10000"
    )


def test_engine_kind_other_than_configured_is_named_with_the_window() -> None:
    local = refusal(
        spec(engine=Engine.REPLICATED_MERGE_TREE),
        TableDedup("MergeTree", Engine.MERGE_TREE, 0),
    )
    assert "engine MergeTree is not replicated but the configured engine is Replicated" in local
    assert "a re-flush to another replica inserts the rows again" in local
    # The window checked is the one the table's engine uses.
    assert f"fix: {ALTER_EVENTS} non_replicated_deduplication_window = 10000" in local
    shared = refusal(
        spec(), TableDedup("ReplicatedMergeTree", Engine.REPLICATED_MERGE_TREE, 10_000)
    )
    assert shared == (
        "table db.events would not deduplicate re-flushed inserts: engine ReplicatedMergeTree "
        "is replicated but the configured engine is MergeTree; "
        "fix: configure engine = ReplicatedMergeTree"
    )


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


@pytest.mark.integration
def test_server_defaults_are_read_for_both_engine_kinds(ch_client: Any) -> None:
    # ClickHouse's defaults: a MergeTree deduplicates nothing unless told to.
    assert default_window(ch_client, Engine.MERGE_TREE) == 0
    assert default_window(ch_client, Engine.REPLICATED_MERGE_TREE) >= 1000


@pytest.mark.integration
def test_existing_table_with_window_zero_is_refused_until_the_fix_in_the_message_runs(
    ch_database: str, ch_client: Any
) -> None:
    ch_client.command(
        f"CREATE TABLE events {COLUMNS_SQL} ENGINE = MergeTree ORDER BY (_partition, _offset)"
        " SETTINGS non_replicated_deduplication_window = 0"
    )
    wanted = spec(ch_database)
    with pytest.raises(UnsafeTableError) as info:
        ensure_table(ch_client, wanted)
    message = str(info.value)
    assert "non_replicated_deduplication_window = 0 (set on the table) deduplicates nothing" in (
        message
    )
    fix = message.split("fix: ", 1)[1]
    assert fix == (
        f"ALTER TABLE `{ch_database}`.`events` MODIFY SETTING "
        "non_replicated_deduplication_window = 10000"
    )
    ch_client.command(fix)
    assert ensure_table(ch_client, wanted) is False


@pytest.mark.integration
def test_existing_table_without_the_setting_gets_the_servers_zero_and_is_refused(
    ch_database: str, ch_client: Any
) -> None:
    ch_client.command(
        f"CREATE TABLE events {COLUMNS_SQL} ENGINE = ReplacingMergeTree"
        " ORDER BY (_partition, _offset)"
    )
    with pytest.raises(UnsafeTableError, match=r"= 0 \(the server's default\) deduplicates"):
        ensure_table(ch_client, spec(ch_database))
    ch_client.command("ALTER TABLE events MODIFY SETTING non_replicated_deduplication_window = 500")
    with pytest.raises(UnsafeTableError, match=r"= 500 \(set on the table\) is below the"):
        ensure_table(ch_client, spec(ch_database))
    assert ensure_table(ch_client, spec(ch_database, dedup_window=500)) is False


@pytest.mark.integration
def test_existing_log_table_is_refused(ch_database: str, ch_client: Any) -> None:
    ch_client.command(f"CREATE TABLE events {COLUMNS_SQL} ENGINE = Log")
    with pytest.raises(UnsafeTableError, match="engine Log does not deduplicate inserts"):
        ensure_table(ch_client, spec(ch_database))


def test_mergetree_endpoints_must_reach_one_table_and_replicated_ones_need_not() -> None:
    one = {"n1 (10.0.0.1:8123)": "u-1", "n2 (10.0.0.2:8123)": "u-1"}
    assert check_one_table(spec(), one) is None
    assert check_one_table(spec(), {"n1 (10.0.0.1:8123)": None}) is None  # one endpoint
    two = {**one, "n3 (10.0.0.3:8123)": "u-3"}
    error = check_one_table(spec(), two)
    assert error is not None
    assert str(error) == (
        "table db.events would not deduplicate re-flushed inserts: engine MergeTree keeps its "
        "deduplication log per server, and the shard's endpoints reach different tables "
        "(n1 (10.0.0.1:8123), n2 (10.0.0.2:8123): uuid u-1; n3 (10.0.0.3:8123): uuid u-3), so "
        "a re-flush to another of them inserts the rows again; fix: engine = "
        "ReplicatedMergeTree, or endpoints that all reach one server"
    )
    assert check_one_table(spec(engine=Engine.REPLICATED_MERGE_TREE), two) is None
    unknown = check_one_table(spec(), {**one, "n2 (10.0.0.2:8123)": None})
    assert unknown is not None
    assert "gives no table UUIDs through n2 (10.0.0.2:8123)" in str(unknown)


@pytest.mark.integration
def test_a_tables_uuid_is_one_through_every_client_and_none_before_it_exists(
    ch_database: str, ch_client: Any, clickhouse: ClickHouseService
) -> None:
    assert table_uuid(ch_client, ch_database, "events") is None
    ensure_table(ch_client, spec(ch_database))
    found = table_uuid(ch_client, ch_database, "events")
    assert found is not None and len(found) == 36
    other = clickhouse.client()
    try:
        assert table_uuid(other, ch_database, "events") == found
    finally:
        other.close()


@pytest.mark.integration
def test_table_created_by_hakafka_passes_its_own_check(ch_database: str, ch_client: Any) -> None:
    assert ensure_table(ch_client, spec(ch_database)) is True
    assert ensure_table(ch_client, spec(ch_database)) is False


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
    ensure_table(client, spec(ch_database))
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
    ensure_table(ch_client, spec(ch_database))
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
