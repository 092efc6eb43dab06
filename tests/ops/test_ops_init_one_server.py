"""`hakafka init` with MergeTree: a shard's endpoints may be several addresses of one server,
never two servers (each would keep its own deduplication log)."""

from __future__ import annotations

from typing import Any

import pytest

from devstack.clickhouse import ClickHouseService
from devstack.cluster import LocalCluster
from tests.commands import edit

pytestmark = pytest.mark.integration


def test_init_accepts_two_addresses_of_one_server_and_refuses_two_servers(
    *,
    make_cluster: Any,
    clickhouse: ClickHouseService,
    clickhouse2: ClickHouseService,
    ch_database2: str,
    hakafka: Any,
) -> None:
    cluster: LocalCluster = make_cluster({"n1": [0, 1], "n2": [0, 1]})
    config = cluster.nodes["n1"].config_path
    same = f'"n2" = "localhost:{clickhouse.port}"'
    edit(config, rf'^"n2" = "127\.0\.0\.1:{clickhouse.port}"$', same, count=2)
    assert hakafka("config", "check", str(config)).code == 0
    done = hakafka("init", "--config", str(config))
    assert done.code == 0, done.err

    edit(config, f"^{same}$", f'"n2" = "127.0.0.1:{clickhouse2.port}"', count=2)
    # --replace: the recorded settings' own guard (another endpoint set is a migration) is
    # not what this shows; the tables' check is.
    refused = hakafka("init", "--replace", "--config", str(config))
    assert refused.code == 1, refused.out
    lines = refused.err.splitlines()
    refusals = lines[lines.index("hakafka: tables refused:") + 1 :]
    n1 = f"n1 (127.0.0.1:{clickhouse.port})"
    n2 = f"n2 (127.0.0.1:{clickhouse2.port})"
    # Both shards, both tables (rows and dead letters), each naming where each endpoint leads.
    assert len(refusals) == 4, refusals
    for line in refusals:
        assert line.startswith("clickhouse shard "), line
        assert "engine MergeTree keeps its deduplication log per server, and the shard's " in line
        assert f"endpoints reach different tables ({n1}: uuid " in line
        assert f"; {n2}: uuid " in line
        assert line.endswith(
            "fix: engine = ReplicatedMergeTree, or endpoints that all reach one server"
        )
