"""The query names of a node's buffers: `<pipeline>` keeps naming a buffer for as long as the
node leads any shard of the pipeline, whichever shard's leader started first."""

from __future__ import annotations

from pathlib import Path

from buffer import Catalog
from hakafka.pipeline import PipelineLeader
from tests.pipeline.fakes import Harness, Topic, pipeline_config, start, wait_for


def test_the_plain_name_passes_to_the_buffer_of_the_shard_still_led(
    tmp_path: Path, leaders: list[PipelineLeader]
) -> None:
    catalog, topic = Catalog(), Topic(partitions=2)
    shard1 = Harness(tmp_path, pipeline_config(), topic, catalog=catalog, shard=1)
    shard0 = Harness(tmp_path, pipeline_config(), topic, catalog=catalog, shard=0)
    shard0.wal_dir_name = "wal-0"
    first = start(shard1, leaders)  # elected first: it takes the plain names
    second = start(shard0, leaders)
    assert catalog.names() == [
        "events",
        "events_dead_letter",
        "events_dead_letter_shard0",
        "events_shard0",
    ]
    first.stop(0.0)
    wait_for(lambda: "events_shard0" not in catalog.names(), "the names passed on")
    assert catalog.names() == ["events", "events_dead_letter"]
    assert second.buffer.rows.name == "events" and second.buffer.dead.name == "events_dead_letter"
    second.stop(0.0)
    wait_for(lambda: catalog.names() == [], "every name released")
