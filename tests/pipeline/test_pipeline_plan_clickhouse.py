"""A block planned by one node, killed between tasks, re-flushed by a node with another
`rows_per_task`: real Spark and the real ClickHouse engine, whose insert deduplication is
what exactly-once rests on. The same re-flush cut by the second node's own `rows_per_task`
(what tokens named before plans) duplicates rows: the hole this closes."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from buffer import OffsetRange
from chlib import Replica, TableSpec, ensure_table
from devstack.clickhouse import ClickHouseService
from hakafka.coordination import PendingIntent
from hakafka.pipeline.blockplan import follow_plan, plan_block
from hakafka.pipeline.buffer import PipelineBlock, make_block
from spark_bridge.flush import FlushTarget, flush
from spark_bridge.plan import FlushTask, sorted_rows, task_slices
from spark_bridge.runtime import prepare_session

pytestmark = [pytest.mark.integration, pytest.mark.spark]

ROWS = 300_000
PARTITIONS = 3
SETTINGS = (("columns", "v Int64"), ("format", "json"), ("on_error", "dead_letter"))


def block() -> PipelineBlock:
    """ROWS rows over PARTITIONS partitions, offsets 0.. per partition, every 50th offset a
    dead letter (no row): the rows' offsets have gaps."""
    offsets = np.arange(ROWS // PARTITIONS * 50 // 49 + 1, dtype=np.int64)
    kept = offsets[offsets % 50 != 7][: ROWS // PARTITIONS]
    parts = [
        pa.table(
            {
                "v": pa.array(kept + p * 10_000_000, pa.int64()),
                "_partition": pa.array(np.full(len(kept), p), pa.int32()),
                "_offset": pa.array(kept, pa.int64()),
            }
        )
        for p in range(PARTITIONS)
    ]
    ranges = {("t", p): OffsetRange(0, int(kept[-1])) for p in range(PARTITIONS)}
    return make_block("b1", ranges, pa.concat_tables(parts), None)


def stats(client: Any) -> tuple[int, int]:
    row = client.query("SELECT count(), uniqExact(_partition, _offset) FROM events").result_rows
    return int(row[0][0]), int(row[0][1])


def test_a_block_killed_between_tasks_is_completed_by_a_node_with_another_rows_per_task(
    spark: SparkSession, clickhouse: ClickHouseService, ch_database: str, ch_client: Any
) -> None:
    prepare_session(spark)
    columns = (("v", "Int64"), ("_partition", "Int32"), ("_offset", "Int64"))
    ensure_table(ch_client, TableSpec(ch_database, "events", columns, order_by="(_offset)"))
    target = FlushTarget(
        ch_database, "events", (Replica("r1", clickhouse.host, clickhouse.port),), "pipe"
    )
    first = plan_block(block(), rows_per_task=70_000)
    assert len(first.tasks) == 5
    intent = PendingIntent("b1", {}, 1, first.tasks, SETTINGS)
    # The first node inserts two of its five tasks, then dies.
    flush(spark, "b1", first.block.rows.table, target, first.rows[:2])
    assert stats(ch_client) == (120_000, 120_000)

    # The next leader, with rows_per_task = 200 000, follows the recorded plan.
    again = follow_plan(block(), intent, SETTINGS, rows_per_task=200_000)
    assert [t.rows for t in again.rows] == [t.rows for t in first.rows]
    done = flush(spark, "b1", again.block.rows.table, target, again.rows)
    assert done.tasks == 5
    assert stats(ch_client) == (ROWS, ROWS), "every row exactly once"

    # Cut by its own rows_per_task, as tokens named row slices before plans: the tokens of
    # 2 tasks of 150 000 rows are new, so ClickHouse takes rows it already has.
    table = sorted_rows(block().rows.table, "b1")
    slices = task_slices(table.num_rows, 200_000)
    own = [FlushTask(f"b1:{i}", start, n) for i, (start, n) in enumerate(slices)]
    flush(spark, "b1", table, target, own)
    rows, distinct = stats(ch_client)
    assert distinct == ROWS and rows == 2 * ROWS, "the old scheme duplicates"
