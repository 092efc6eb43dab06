"""`hakafka init --distributed CLUSTER`: a Distributed table `<table>_all` over the shard tables."""

from __future__ import annotations

from typing import Any

import pytest

from chlib.tables import TableSpec
from devstack.clickhouse import ClickHouseService
from devstack.cluster import LocalCluster
from hakafka.ops.init import distributed_sql


def test_the_distributed_table_reads_each_shard_table_of_the_cluster() -> None:
    spec = TableSpec("analytics", "events", (("v", "Int64"),), order_by="v")
    assert distributed_sql(spec, "prod") == (
        "CREATE TABLE IF NOT EXISTS `analytics`.`events_all` AS `analytics`.`events`"
        " ENGINE = Distributed(`prod`, `analytics`, `events`)"
    )


@pytest.mark.integration
def test_init_names_each_server_that_has_no_such_cluster(
    *, make_cluster: Any, clickhouse: ClickHouseService, ch_database: str, hakafka: Any
) -> None:
    # The dev stack's ClickHouse (chdb) has no remote_servers: every server refuses, by name.
    cluster: LocalCluster = make_cluster({"n1": [0, 1]})
    config = str(cluster.nodes["n1"].config_path)
    refused = hakafka("init", "--config", config, "--distributed", "nosuch")
    assert refused.code == 1, refused.err
    lines = refused.err.splitlines()
    refusals = lines[lines.index("hakafka: tables refused:") + 1 :]
    where = f"clickhouse n1 ({clickhouse.host}:{clickhouse.port})"
    assert len(refusals) == 2, refusals
    for line, table in zip(refusals, ["events_all", "events_dead_letter_all"], strict=True):
        assert line.startswith(f"{where}: distributed table {table} over cluster 'nosuch': ")
        assert "Requested cluster 'nosuch' not found" in line, line
    # The shard tables themselves were created: the plain init agrees.
    assert hakafka("init", "--config", config).code == 0
