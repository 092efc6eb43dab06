"""ShardRunner's supervision of its pipelines, with in-memory pipeline parts and a stand-in
leadership (no ZooKeeper): a pipeline that fails to start is replaced, not counted healthy."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest
from prometheus_client import CollectorRegistry

from buffer import MemoryTable
from hakafka.coordination import BecameLeader, Coordinator, Leadership, LeadershipState
from hakafka.daemon.shard import ShardRunner, restart_delay
from hakafka.metrics import Metrics
from hakafka.pipeline import PipelineLeader, PipelineState
from tests.pipeline.fakes import Harness, Topic, pipeline_config, wait_for


@dataclass
class StandInLeadership:
    """The part of a Leadership the shard's supervision reads."""

    state: LeadershipState = LeadershipState.LEADER
    status: str = "elected"

    def fenced(self) -> object:
        return None

    def set_status(self, status: str) -> None:
        self.status = status


@pytest.fixture
def runner(tmp_path: Path) -> Iterator[tuple[ShardRunner, Harness]]:
    h = Harness(tmp_path, pipeline_config(), Topic(partitions=1))
    made: list[PipelineLeader] = []

    def make(_leadership: Leadership, only: str | None) -> list[PipelineLeader]:
        h.wal_dir_name = f"wal-{len(made)}"  # a stopped pipeline may still hold its WAL
        made.append(h.leader())
        return [made[-1]]

    shard = ShardRunner(
        0,
        cast(Coordinator, None),  # not reached: no election here
        make,
        metrics=Metrics.create(registry=CollectorRegistry()),
        flush_grace_s=1.0,
        stuck_after_s=60.0,
    )
    shard.leadership = cast(Any, StandInLeadership())
    yield shard, h
    shard.stop(0.0)
    for p in made:
        p.stop(0.0)


def test_a_pipeline_that_failed_to_start_is_replaced(
    runner: tuple[ShardRunner, Harness],
) -> None:
    shard, h = runner
    # An abandoned instance still holds the buffer's names: the new term's pipeline cannot
    # register them and so cannot start.
    schema = h.leader().buffer.rows.schema
    for name in ("events", "events_shard0"):
        h.catalog.add(MemoryTable(name, schema, 1 << 20))
    shard._thread.start()  # the shard's own event thread, as `start()` runs it
    shard._events.put(BecameLeader(epoch=1, token=1))
    wait_for(
        lambda: bool(shard.pipelines) and not shard.pipelines[0].status.state.live,
        "the term's pipeline to fail to start",
    )
    (first,) = shard.pipelines
    assert first.status.state is PipelineState.FAILED
    assert "already in the catalog" in (first.status.error or "")
    assert not shard.healthy()
    h.catalog.remove("events")  # the abandoned instance lets go
    h.catalog.remove("events_shard0")
    # Restarts follow 1 s, 2 s, ... apart; one made after the names were released consumes.
    wait_for(
        lambda: shard.pipelines[0].status.state is PipelineState.CONSUMING,
        "a replacement that consumes",
        timeout=restart_delay(1) + restart_delay(2) + 10,
    )
    (second,) = shard.pipelines
    assert second is not first and second.status.restarts >= 1
    assert shard.healthy()
    wait_for(lambda: cast(StandInLeadership, shard.leadership).status == "consuming", "announce")
