"""ClickHouse's deduplication prerequisites on the table side: the DDL's window, and the
engine and window of an existing table (`ensure_table` refuses what would not deduplicate a
re-flush, with the fix). Decisions are unit-tested; the rest runs on the ClickHouse front.
The settings pinned on every insert: tests/spark_bridge/test_spark_bridge_insert.py."""

from __future__ import annotations

from typing import Any

import pytest

from chlib.tables import (
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
from devstack.clickhouse import ClickHouseService

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


def test_ddl_carries_the_dedup_window_of_each_engine() -> None:
    table = TableSpec(
        "db",
        "events",
        (("id", "Int64"), ("_offset", "Int64")),
        order_by="(_offset)",
        partition_by="id % 4",
        ttl=None,
        dedup_window=5000,
    )
    sql = table.create_sql()
    assert "CREATE TABLE IF NOT EXISTS `db`.`events`" in sql
    assert "ENGINE = MergeTree" in sql and "PARTITION BY id % 4" in sql
    assert "non_replicated_deduplication_window = 5000" in sql
    replicated = TableSpec(
        "db", "events", (("id", "Int64"),), engine=Engine.REPLICATED_MERGE_TREE
    ).create_sql()
    assert "ReplicatedMergeTree(" in replicated and "replicated_deduplication_window" in replicated


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
