"""Helper for the Spark Connect test (tests/spark_bridge/test_spark_bridge_cluster_modes.py):
`flush_through_connect`, called in a fresh interpreter (`CONNECT_PROBE` there), flushes
blocks through a Spark Connect server and returns what came of it."""

from __future__ import annotations

import os
from typing import Any

from pyspark.sql import SparkSession

from chlib import ensure_table
from chlib.replicas import Replica
from spark_bridge.flush import FlushTarget, flush_block
from spark_bridge.runtime import CONNECT_MODE_ENV, SparkRuntime, SparkSettings
from tests.helpers.landing import stats
from tests.helpers.spark_blocks import make_block, spec


def flush_through_connect(url: str, database: str, host: str, port: int) -> dict[str, Any]:
    """Flush blocks through the Connect server at `url` into `database` on the ClickHouse
    at host:port, and say what came of it. Run in a fresh interpreter (`CONNECT_PROBE`): a
    process that already has a classic session (the test session's) cannot open a Connect
    one, and a daemon never has both."""
    import clickhouse_connect

    client = clickhouse_connect.get_client(host=host, port=port, database=database)
    target_replica = Replica("r1", host, port)
    runtime = SparkRuntime(SparkSettings(remote=url))
    session: SparkSession = runtime.start()
    seen: dict[str, Any] = {"module": type(session).__module__}
    try:
        ensure_table(client, spec(database))
        target = FlushTarget(database, "events", (target_replica,), "pipe", rows_per_task=50_000)
        result = flush_block(session, make_block(200_000, seed=1), target)
        seen["first"] = [result.rows, result.tasks, result.attempts, *stats(client)]
        # The same block again (another arrival order): same tokens, nothing added.
        again = flush_block(session, make_block(200_000, seed=2), target)
        seen["again"] = [again.tasks, *stats(client)]
        # A transform runs in the server's Python workers too.
        ensure_table(client, spec(database, "doubled"))
        sql = "SELECT v * 2 AS v, name, _partition, _offset FROM block"
        doubled = FlushTarget(database, "doubled", (target_replica,), "pipe", transform=sql)
        seen["doubled_rows"] = flush_block(session, make_block(1_000, seed=3), doubled).rows
        seen["doubled_sum"] = int(client.query("SELECT sum(v) FROM doubled").result_rows[0][0])
    finally:
        runtime.stop()
        client.close()
    # Out of Connect mode again: later classic sessions of the process stay classic.
    seen["mode_left"] = CONNECT_MODE_ENV in os.environ
    return seen
