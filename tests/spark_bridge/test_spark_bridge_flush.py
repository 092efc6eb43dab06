"""spark_bridge against real Spark (the session fixture) and the ClickHouse HTTP front."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark import cloudpickle
from pyspark.sql import SparkSession
from pyspark.sql import functions as sf

from chlib import (
    NoWritableReplicaError,
    Replica,
    RetryPolicy,
    SchemaMismatchError,
    TableSpec,
    ensure_table,
)
from devstack.clickhouse import ClickHouseService
from spark_bridge.flush import FlushTarget, flush_block
from spark_bridge.reader import read_table
from spark_bridge.runtime import prepare_session
from tests.helpers.landing import stats
from tests.helpers.spark_blocks import COLUMNS, make_block, replica, spec

pytestmark = [pytest.mark.integration, pytest.mark.spark]

WARM_PROBE = Path(__file__).with_name("spark_warm_probe.py")
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def bridge(spark: SparkSession) -> SparkSession:
    prepare_session(spark)
    return spark


def test_flush_1m_rows_exactly_once_and_reflush_adds_nothing(
    bridge: SparkSession, clickhouse: ClickHouseService, ch_database: str, ch_client: Any
) -> None:
    ensure_table(ch_client, spec(ch_database))
    target = FlushTarget(
        ch_database, "events", (replica(clickhouse),), "pipe", rows_per_task=250_000
    )
    result = flush_block(bridge, make_block(1_000_000, seed=1), target)
    assert (result.rows, result.tasks, result.replica, result.attempts) == (1_000_000, 4, "r1", 1)
    assert stats(ch_client) == (1_000_000, 1_000_000)
    # Same block arriving in another order: same sorted slices, same tokens, nothing added.
    again = flush_block(bridge, make_block(1_000_000, seed=2), target)
    assert again.tasks == 4
    assert stats(ch_client) == (1_000_000, 1_000_000)
    assert ch_client.query("SELECT sum(v) FROM events").result_rows[0][0] == sum(range(1_000_000))


TRANSFORMS = '''
import time
from pathlib import Path

import pyarrow as pa
from pyspark import TaskContext


def add_doubled(df):
    return df.withColumn("doubled", df["v"] * 2)


def fail_last_task(marker, url, database, wait_rows, tasks):
    """Identity; while `marker` exists the last task waits for `wait_rows` rows in the table
    (earlier tasks inserted), then raises: a flush killed half way."""

    def run(batches):
        task = TaskContext.get().partitionId()
        if task == tasks - 1 and Path(marker).exists():
            import clickhouse_connect

            client = clickhouse_connect.get_client(host=url[0], port=url[1], database=database)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                if client.query("SELECT count() FROM events").result_rows[0][0] >= wait_rows:
                    break
                time.sleep(0.05)
            raise RuntimeError("injected failure in task %d" % task)
        yield from batches

    def transform(df):
        return df.mapInArrow(run, df.schema)

    return transform
'''


@pytest.fixture
def transforms(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """An importable transforms module (shipped to executors by value)."""
    name = f"bridge_transforms_{tmp_path.name}".replace("-", "_")
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(TRANSFORMS))
    monkeypatch.syspath_prepend(str(tmp_path))
    module = __import__(name)
    cloudpickle.register_pickle_by_value(module)
    try:
        yield module
    finally:
        cloudpickle.unregister_pickle_by_value(module)
        sys.modules.pop(name, None)


def test_attempt_killed_half_way_then_reflushed_leaves_one_copy(  # noqa: PLR0917
    bridge: SparkSession,
    clickhouse: ClickHouseService,
    ch_database: str,
    ch_client: Any,
    transforms: Any,
    tmp_path: Path,
) -> None:
    ensure_table(ch_client, spec(ch_database))
    marker = tmp_path / "fail-first-attempt"
    marker.touch()
    failing = transforms.fail_last_task(
        str(marker), (clickhouse.host, clickhouse.port), ch_database, 200_000, 4
    )
    transforms.failing = failing
    target = FlushTarget(
        ch_database,
        "events",
        (replica(clickhouse),),
        "pipe",
        transform=f"{transforms.__name__}:failing",
        rows_per_task=100_000,
        retry=RetryPolicy(max_attempts=1),
    )
    block = make_block(400_000, "half")
    with pytest.raises(Exception, match="injected failure in task 3"):
        flush_block(bridge, block, target)
    partial = stats(ch_client)
    assert 200_000 <= partial[0] < 400_000 and partial[0] == partial[1]
    marker.unlink()
    result = flush_block(bridge, block, target)
    assert (result.rows, result.tasks) == (400_000, 4)
    assert stats(ch_client) == (400_000, 400_000)


def test_transforms_callable_and_sql(
    bridge: SparkSession,
    clickhouse: ClickHouseService,
    ch_database: str,
    ch_client: Any,
    transforms: Any,
) -> None:
    ensure_table(ch_client, spec(ch_database, "doubled", (*COLUMNS, ("doubled", "Int64"))))
    ensure_table(
        ch_client,
        spec(
            ch_database,
            "evens",
            (("v", "Int64"), ("_partition", "Int32"), ("_offset", "Int64"), ("tripled", "Int64")),
        ),
    )
    block = make_block(10_000)
    base: dict[str, Any] = {
        "replicas": (replica(clickhouse),),
        "token_prefix": "pipe",
        "rows_per_task": 3_000,
    }
    done = flush_block(
        bridge,
        block,
        FlushTarget(ch_database, "doubled", transform=f"{transforms.__name__}:add_doubled", **base),
    )
    assert (done.rows, done.tasks) == (10_000, 4)
    assert ch_client.query("SELECT count(), countIf(doubled = 2 * v) FROM doubled").result_rows == [
        (10_000, 10_000)
    ]
    sql = "SELECT v, _partition, _offset, v * 3 AS tripled FROM block WHERE v % 2 = 0"
    evens = flush_block(bridge, block, FlushTarget(ch_database, "evens", transform=sql, **base))
    assert (evens.rows, evens.tasks) == (5_000, 4)
    assert ch_client.query(
        "SELECT count(), countIf(tripled = 3 * v AND v % 2 = 0) FROM evens"
    ).result_rows == [(5_000, 5_000)]


@pytest.fixture
def second_front(tmp_path: Path) -> Iterator[ClickHouseService]:
    ch = ClickHouseService(tmp_path / "ch2")
    ch.start()
    try:
        yield ch
    finally:
        ch.stop()


def test_replica_choice_not_writable_dead_and_failing(
    bridge: SparkSession,
    clickhouse: ClickHouseService,
    second_front: ClickHouseService,
    ch_database: str,
    ch_client: Any,
) -> None:
    ensure_table(ch_client, spec(ch_database))
    second_front.client().command(f"CREATE DATABASE `{ch_database}`")
    other = second_front.client(database=ch_database)
    ensure_table(other, spec(ch_database))
    main = replica(clickhouse, "main")
    block = make_block(20_000)
    retry = RetryPolicy(backoff_initial=0.05, time_budget=30)

    def target(*replicas: Replica) -> FlushTarget:
        return FlushTarget(
            ch_database, "events", replicas, "pipe", rows_per_task=8_000, retry=retry
        )

    # The local replica is being replaced: never written, the block lands on the other one.
    replacing = replica(second_front, "local", local=True, writable=False)
    result = flush_block(bridge, block, target(replacing, main))
    assert (result.replica, result.attempts) == ("main", 1)
    assert other.query("SELECT count() FROM events").result_rows == [(0,)]
    assert stats(ch_client) == (20_000, 20_000)
    with pytest.raises(NoWritableReplicaError, match="local"):
        flush_block(bridge, block, target(replacing))

    # A healthy local replica whose insert fails: the block is retried on the next replica.
    other.command("DROP TABLE events")
    failing = replica(second_front, "local", local=True)
    result = flush_block(bridge, make_block(20_000, "b2", start=20_000), target(main, failing))
    assert (result.replica, result.attempts) == ("main", 2)
    assert stats(ch_client) == (40_000, 40_000)
    other.close()

    # A dead local replica fails its health check and is skipped without costing an attempt.
    second_front.stop()
    started = time.monotonic()
    result = flush_block(bridge, make_block(20_000, "b3", start=40_000), target(failing, main))
    assert (result.replica, result.attempts) == ("main", 1)
    assert stats(ch_client) == (60_000, 60_000)
    assert time.monotonic() - started < 30


def test_read_table_rows_filters_and_partitions(
    bridge: SparkSession, clickhouse: ClickHouseService, ch_database: str, ch_client: Any
) -> None:
    table = TableSpec(
        ch_database, "events", COLUMNS, order_by="(_partition, _offset)", partition_by="_partition"
    )
    ensure_table(ch_client, table)
    flush_block(
        bridge,
        make_block(40_000),
        FlushTarget(ch_database, "events", (replica(clickhouse),), "pipe"),
    )
    df = read_table(
        bridge, "events", hosts=[(clickhouse.host, clickhouse.port)], database=ch_database
    )
    assert df.rdd.getNumPartitions() == 4  # one per ClickHouse partition
    rows = sorted((r.v, r.name, r._partition, r._offset) for r in df.collect())
    expected = sorted((i, f"n{i % 13}", i % 4, i // 4) for i in range(40_000))
    assert rows == expected

    filtered = df.filter((sf.col("v") >= 1_000) & (sf.col("name").startswith("n1")))
    plan = filtered._jdf.queryExecution().executedPlan().toString()
    operators = [line.lstrip(" +-*()0123456789") for line in plan.splitlines()]
    assert not [op for op in operators if op.startswith("Filter")], plan  # all pushed down
    got = sorted(r.v for r in filtered.collect())
    assert got == [i for i in range(1_000, 40_000) if f"n{i % 13}".startswith("n1")]

    ranged = read_table(
        bridge,
        "events",
        hosts=f"{clickhouse.host}:{clickhouse.port}",
        database=ch_database,
        columns=["v", "_offset"],
        where="v < 30000",
        partition_by="v",
        partitions=3,
    )
    assert ranged.rdd.getNumPartitions() == 3
    assert ranged.columns == ["v", "_offset"]
    assert sorted(r.v for r in ranged.collect()) == list(range(30_000))


def test_schema_mismatch_names_the_columns(ch_database: str, ch_client: Any) -> None:
    assert ensure_table(ch_client, spec(ch_database)) is True
    assert ensure_table(ch_client, spec(ch_database)) is False
    wanted = (("v", "Int32"), ("name", "String"), ("_partition", "Int32"), ("extra", "String"))
    with pytest.raises(SchemaMismatchError) as info:
        ensure_table(ch_client, spec(ch_database, columns=wanted))
    message = str(info.value)
    assert "missing columns ['extra']" in message
    assert "unexpected columns ['_offset']" in message
    assert "v: table has Int64, spec wants Int32" in message


@pytest.mark.parametrize("mode", ["warm", "cold"])
def test_every_python_worker_starts_with_the_flush_loaded(mode: str) -> None:
    # A fresh Spark (a process of its own), its first tasks after `warm_workers` or as the very
    # first job: each worker, forked by `worker_daemon`, already has the flush's modules and a
    # frozen heap (PySpark's own daemon forks bare workers that import them in their task).
    done = subprocess.run(
        [sys.executable, str(WARM_PROBE), mode],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(report["tasks"]) == report["cores"] >= 1
    ready = [
        t["flush_imported"] and t["clickhouse_imported"] and t["frozen"] for t in report["tasks"]
    ]
    assert ready == [True] * report["cores"], report
