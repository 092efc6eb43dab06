"""A new term needs one reachable ClickHouse replica, not all: a node that dies with its own
replica must not keep the next leader from flushing. Real Spark and the real ClickHouse
engine; the dead replica is an address where nothing listens, as after a node's death."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from buffer import OffsetRange
from devstack.clickhouse import ClickHouseService
from devstack.process import free_port
from hakafka.pipeline.blockplan import plan_block
from hakafka.pipeline.buffer import make_block
from hakafka.pipeline.sink import PipelineSink, TablesUnreachableError
from hakafka.settings import pipeline_schema
from spark_bridge import Replica, prepare_session
from tests.pipeline.fakes import TOPIC, Topic, decoder_for, pipeline_config

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def sink_for(database: str, spark: SparkSession) -> PipelineSink:
    config = pipeline_config()
    config = dataclasses.replace(
        config, clickhouse=dataclasses.replace(config.clickhouse, database=database)
    )
    pipeline = config.pipelines[0]
    return PipelineSink(config, pipeline, pipeline_schema(pipeline), lambda: spark)


def planned(block_id: str, first: int, count: int) -> Any:
    topic = Topic(partitions=1)
    topic.produce(0, first + count)
    rows = decoder_for(pipeline_config().pipelines[0]).decode(topic.logs[0][first:]).rows
    block = make_block(
        block_id,
        {(TOPIC, 0): OffsetRange(first, first + count - 1)},
        pa.Table.from_batches([rows]),
        None,
    )
    return plan_block(block, rows_per_task=100)


def count(service: ClickHouseService, database: str) -> int:
    client = service.client(database=database)
    try:
        if not int(str(client.command("EXISTS TABLE events"))):
            return -1
        return int(str(client.command("SELECT count() FROM events")))
    finally:
        client.close()


def test_a_new_term_flushes_while_one_replica_is_down_and_a_late_one_gets_its_tables(
    spark: SparkSession,
    clickhouse: ClickHouseService,
    clickhouse2: ClickHouseService,
    ch_database2: str,
) -> None:
    prepare_session(spark)
    database = ch_database2
    sink = sink_for(database, spark)
    dead = Replica("n2", "127.0.0.1", free_port(), local=True)  # died with its node
    live = Replica("n1", clickhouse.host, clickhouse.port)

    started = time.monotonic()
    sink.ensure_tables((dead, live))  # a new term: one replica answers, that is enough
    assert time.monotonic() - started < 10.0
    assert count(clickhouse, database) == 0
    flushed = sink.flush(planned("b1", 0, 250), (dead, live))
    assert (flushed.rows, flushed.replica) == (250, "n1")
    assert count(clickhouse, database) == 250

    # A replica that had no tables (it was down at the term's start) gets them before it is
    # written to: here the local one, which every write prefers.
    late = Replica("n3", clickhouse2.host, clickhouse2.port, local=True)
    assert count(clickhouse2, database) == -1
    flushed = sink.flush(planned("b2", 250, 100), (late, live))
    assert (flushed.rows, flushed.replica) == (100, "n3")
    assert count(clickhouse2, database) == 100

    with pytest.raises(TablesUnreachableError, match=r"^no replica could be given the tables: "):
        sink.ensure_tables((dead, Replica("n4", "127.0.0.1", free_port())))
