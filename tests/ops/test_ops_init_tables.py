"""`hakafka init` against existing ClickHouse tables on the real local stack: a table that
would not deduplicate a re-flush is refused with its fix, and accepted once the fix ran."""

from __future__ import annotations

from typing import Any

import pytest

from devstack.clickhouse import ClickHouseService
from devstack.cluster import LocalCluster

pytestmark = [pytest.mark.integration]


def test_init_refuses_a_table_without_a_dedup_window_and_names_the_fix(
    *,
    make_cluster: Any,
    clickhouse: ClickHouseService,
    ch_database: str,
    ch_client: Any,
    hakafka: Any,
) -> None:
    cluster: LocalCluster = make_cluster({"n1": [0, 1]})  # both shards on one ClickHouse
    config = str(cluster.nodes["n1"].config_path)
    created = hakafka("init", "--config", config)
    assert created.code == 0, created.err

    # The same columns, recreated by hand as a MergeTree that sets no window: the server's
    # default (0) applies, and it deduplicates nothing.
    ch_client.command("CREATE TABLE by_hand AS events ENGINE = MergeTree ORDER BY tuple()")
    ch_client.command("DROP TABLE events")
    ch_client.command("RENAME TABLE by_hand TO events")

    refused = hakafka("init", "--config", config)
    assert refused.code == 1
    assert refused.out == ""
    lines = refused.err.splitlines()
    refusals = lines[lines.index("hakafka: tables refused:") + 1 :]
    fix = (
        f"ALTER TABLE `{ch_database}`.`events` MODIFY SETTING "
        "non_replicated_deduplication_window = 10000"
    )
    # Named once, though both shards use that server; the dead-letter table is fine.
    assert refusals == [
        f"clickhouse n1 ({clickhouse.host}:{clickhouse.port}): table {ch_database}.events"
        " would not deduplicate re-flushed inserts: non_replicated_deduplication_window = 0"
        f" (the server's default) deduplicates nothing; fix: {fix}"
    ]

    ch_client.command(fix)
    fixed = hakafka("init", "--config", config)
    assert fixed.code == 0, fixed.err
    # The first run recorded the shard-wide settings; this one finds them agreeing.
    assert fixed.out == created.out.replace("settings recorded in", "settings agree with").replace(
        " (nothing was recorded)", ""
    )
