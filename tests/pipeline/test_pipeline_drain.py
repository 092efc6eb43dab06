"""Draining a pipeline for a reshard, and replay under a new layout of partitions.

A draining leader re-flushes the pending block, flushes what its WAL holds past the
checkpoint, commits, and ends `drained` without consuming. A leader whose WAL was written
under an earlier layout replays only the partitions its shard owns now. In-memory parts.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from hakafka.pipeline import PipelineLeader, PipelineState
from tests.pipeline.fakes import TOPIC, Harness, Topic, pipeline_config, start, wait_for


def test_a_draining_leader_commits_the_pending_block_and_its_wal_then_ends(
    tmp_path: Path, leaders: list[PipelineLeader]
) -> None:
    topic = Topic(partitions=2)
    topic.produce(0, 40)
    topic.produce(1, 30, bad=[4])
    # The first leader flushes one block, then holds the next one in flight while more
    # arrives, and loses its term: a pending block plus WAL rows past it.
    h = Harness(tmp_path, pipeline_config(min_rows=60, max_rows=60), topic)
    h.sink.gate.clear()
    first = start(h, leaders)
    wait_for(h.sink.entered.is_set, "the first flush")
    topic.produce(0, 25)
    wait_for(lambda: first.positions().get(0) == 65, "the rows after the block in the WAL")
    h.fenced.fenced = True
    h.sink.gate.set()
    first.stop(5.0)
    assert h.fenced.pending is not None and h.fenced.commits == 0
    h.fenced = h.fenced.next_term()
    consumers = len(h.consumers)
    topic.produce(1, 10)  # arrives meanwhile: a draining leader must not read it
    second = start(h, leaders, drain=True)
    wait_for(lambda: second.status.state is PipelineState.DRAINED, "the drain")
    assert h.fenced.checkpoint[TOPIC] == {0: 65, 1: 30}
    assert h.fenced.pending is None
    assert h.sink.offsets() == sorted(
        [(0, o) for o in range(65)] + [(1, o) for o in range(30) if o != 4]
    )
    assert h.sink.dead_offsets() == [(1, 4)]
    assert len(h.consumers) == consumers, "a draining leader builds no consumer"
    # DRAINED is published before the pipeline's threads return: under load, a moment before.
    wait_for(lambda: not second.running, "the drained pipeline's threads to end")
    assert second.status.restartable


def test_replay_skips_partitions_an_earlier_layout_left_in_the_wal(
    tmp_path: Path, leaders: list[PipelineLeader]
) -> None:
    topic = Topic(partitions=2)
    topic.produce(0, 20)
    topic.produce(1, 20)
    # One shard read both partitions; its WAL holds both, unflushed.
    h = Harness(tmp_path, pipeline_config(min_rows=1000, min_age=60.0, max_age=60.0), topic)
    first = start(h, leaders)
    wait_for(lambda: first.buffer.rows.row_count == 40, "both partitions in the WAL")
    first.stop(0.0)
    # Resharded to two shards: partition 1 (and its checkpoint) moved to shard 1, so shard 0
    # replays partition 0 only (partition 1's rows belong to shard 1's leader now).
    h.config = dataclasses.replace(h.config, shard_count=2)
    h.fenced = h.fenced.next_term()
    second = start(h, leaders)
    assert second.wait_consuming(5.0)
    assert second.status.replayed_rows == 20


def test_a_partition_whose_checkpoint_is_in_another_shard_is_not_read_from_the_start(
    tmp_path: Path, leaders: list[PipelineLeader]
) -> None:
    # The layout changed by hand (one shard, was two): partition 1's checkpoint is still in
    # shard 1. Reading it from its low watermark would write its rows again.
    topic = Topic(partitions=2)
    topic.produce(0, 10)
    topic.produce(1, 10)
    h = Harness(tmp_path, pipeline_config(), topic)
    h.fenced.checkpoint = {TOPIC: {0: 5}}
    h.fenced.others = {1: {TOPIC: {1: 7}}}
    leader = start(h, leaders)
    wait_for(lambda: leader.status.state is PipelineState.FAILED, "the refusal")
    assert (
        "partition 1 of events belongs to shard 0 in this config, but its checkpoint (7) is in "
        "shard 1: the layout changed without `hakafka reshard`"
    ) in (leader.status.error or "")
    assert not leader.status.restartable
    assert h.consumers == [] and h.sink.attempts == 0
