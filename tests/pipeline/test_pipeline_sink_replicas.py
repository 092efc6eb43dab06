"""A new term needs one reachable ClickHouse replica, not all: a node that dies with its own
replica must not keep the next leader from flushing. Real Spark and the real ClickHouse
engine; a node's replica is its own address of the server (a TCP forwarder), killed with it."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from buffer import OffsetRange
from chlib import Replica
from chlib.tables import UnsafeTableError
from devstack.clickhouse import ClickHouseService
from devstack.process import free_port
from devstack.tcp_forward import TcpForwarder
from hakafka.pipeline.blockplan import plan_block
from hakafka.pipeline.buffer import make_block
from hakafka.pipeline.sink import PipelineSink, TablesUnreachableError
from hakafka.settings import pipeline_schema
from spark_bridge.runtime import prepare_session
from tests.pipeline.fakes import TOPIC, Topic, decoder_for, pipeline_config

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def sink_for(database: str, spark: SparkSession) -> PipelineSink:
    config = pipeline_config()
    config = dataclasses.replace(
        config, clickhouse=dataclasses.replace(config.clickhouse, database=database)
    )
    pipeline = config.pipelines[0]
    # recheck_s=0: a replica that came back is tried at the next flush, not 10 s later.
    return PipelineSink(config, pipeline, pipeline_schema(pipeline), lambda: spark, recheck_s=0.0)


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
    tmp_path: Path,
    spark: SparkSession,
    clickhouse: ClickHouseService,
    clickhouse2: ClickHouseService,
    ch_database2: str,
) -> None:
    prepare_session(spark)
    database = ch_database2
    sink = sink_for(database, spark)
    port = free_port()
    n2_replica = TcpForwarder(
        "n2's replica", [f"127.0.0.1:{port}={clickhouse.host}:{clickhouse.port}"], tmp_path / "fw"
    )
    n2 = Replica("n2", "127.0.0.1", port, local=True)  # died with its node: nothing listens
    n1 = Replica("n1", clickhouse.host, clickhouse.port)

    started = time.monotonic()
    sink.ensure_tables((n2, n1))  # a new term: one replica answers, that is enough
    assert time.monotonic() - started < 10.0
    assert count(clickhouse, database) == 0
    flushed = sink.flush(planned("b1", 0, 250), (n2, n1))
    assert (flushed.rows, flushed.replica) == (250, "n1")
    assert count(clickhouse, database) == 250

    # n2 comes back: its replica is checked before it is written to (it shows the same table
    # as n1's, one server at two addresses), then every write prefers it, being local.
    n2_replica.start()
    try:
        flushed = sink.flush(planned("b2", 250, 100), (n2, n1))
    finally:
        n2_replica.kill()
    assert (flushed.rows, flushed.replica) == (100, "n2")
    assert count(clickhouse, database) == 350

    # A replica that is another server keeps another deduplication log: refused before a
    # row is written to it.
    other = Replica("n3", clickhouse2.host, clickhouse2.port, local=True)
    with pytest.raises(UnsafeTableError, match=r"endpoints reach different tables \(n1 \("):
        sink.flush(planned("b3", 350, 100), (other, n1))
    assert count(clickhouse2, database) == 0
    assert count(clickhouse, database) == 350

    with pytest.raises(TablesUnreachableError, match=r"^no replica could be given the tables: "):
        sink.ensure_tables((n2, Replica("n4", "127.0.0.1", free_port())))
