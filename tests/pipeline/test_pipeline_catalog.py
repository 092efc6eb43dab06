"""The query names of a node's buffers: one name per pipeline, over every shard the node
leads, whichever shard's leader started first; `_shard` tells the shards' rows apart."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from buffer import Catalog, SqlEngine
from hakafka.pipeline import PipelineLeader
from tests.pipeline.fakes import Harness, Topic, pipeline_config, start, wait_for


def test_one_name_per_pipeline_covers_every_shard_the_node_leads(
    tmp_path: Path, leaders: list[PipelineLeader]
) -> None:
    # Nothing flushes during the test: every consumed row stays in the buffer.
    held = pipeline_config(min_rows=10**6, min_age=600.0, max_age=600.0)
    config = dataclasses.replace(held, shard_count=2)
    catalog, topic0, topic1 = Catalog(), Topic(partitions=1), Topic(partitions=2)
    topic0.produce(0, 30, bad=[4])  # shard 0 owns partition 0, shard 1 partition 1
    topic1.produce(1, 50, bad=[7, 8])
    shard1 = Harness(tmp_path, config, topic1, catalog=catalog, shard=1)
    shard0 = Harness(tmp_path, config, topic0, catalog=catalog, shard=0)
    shard0.wal_dir_name = "wal-0"
    engine = SqlEngine(catalog)
    try:
        first = start(shard1, leaders)  # elected first
        second = start(shard0, leaders)
        assert catalog.names() == ["events", "events_dead_letter"]
        wait_for(
            lambda: first.buffer.rows.row_count == 48 and second.buffer.rows.row_count == 29,
            "both buffers to hold their shard's rows",
        )
        by_shard = "SELECT _shard, count(*) AS n, min(_partition) AS p FROM {} GROUP BY _shard"
        assert engine.query(by_shard.format("events") + " ORDER BY _shard").to_pylist() == [
            {"_shard": 0, "n": 29, "p": 0},
            {"_shard": 1, "n": 48, "p": 1},
        ]
        assert engine.query("SELECT count(*) AS n FROM events").to_pylist() == [{"n": 77}]
        dead = "SELECT _shard, count(*) AS n FROM events_dead_letter GROUP BY _shard ORDER BY 1"
        assert engine.query(dead).to_pylist() == [{"_shard": 0, "n": 1}, {"_shard": 1, "n": 2}]
        # A query for one shard reads only that shard's tables.
        assert engine.query("SELECT count(*) AS n FROM events", 1).to_pylist() == [{"n": 48}]

        first.stop(0.0)
        wait_for(lambda: len(catalog.views(1)) == 0, "shard 1's tables released")
        assert catalog.names() == ["events", "events_dead_letter"]
        assert engine.query("SELECT _shard, count(*) AS n FROM events GROUP BY 1").to_pylist() == [
            {"_shard": 0, "n": 29}
        ]
        second.stop(0.0)
        wait_for(lambda: catalog.names() == [], "every name released")
    finally:
        engine.close()
