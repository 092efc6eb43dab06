"""A pipeline that waits says what for, and how long: a missing topic, Kafka unreachable, a
suspended term. Each wait is a named state with its age in `status.waits`, counts as no
progress (`stalled_for`), and `stall_reason` names it; once it ends, data moves again."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from hakafka.consumer.partition_consumer import KafkaMetadataError
from hakafka.pipeline import PipelineLeader, PipelineState
from hakafka.pipeline.state import Waiting
from tests.pipeline.fakes import (
    TOPIC,
    FakeConsumer,
    Harness,
    Topic,
    one_partition,
    pipeline_config,
    start,
    wait_for,
)


def kinds(leader: PipelineLeader) -> set[Waiting]:
    return {w.kind for w in leader.status.current_waits()}


def test_a_missing_topic_is_waited_for_by_name_until_it_is_created(
    tmp_path: Path, leaders: list[PipelineLeader], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("hakafka.pipeline.lane_reader.TOPIC_RECHECK_S", 0.2)
    topic = Topic(partitions=0)  # a typo in the config: no such topic
    h = Harness(tmp_path, pipeline_config(), topic)
    leader = start(h, leaders)
    wait_for(lambda: Waiting.TOPIC_MISSING in kinds(leader), "the topic wait")
    assert leader.status.state is PipelineState.CONSUMING  # nothing failed: it waits
    time.sleep(1.1)
    now = time.monotonic()
    assert leader.stalled_for(now) >= 1.0
    assert leader.stall_reason(now).startswith("waiting_for_topic for 1 s: ")
    assert leader.stall_reason(now).endswith(f"topic {TOPIC} does not exist")

    topic.logs[0], topic.ends[0] = [], 0  # the topic is created
    topic.produce(0, 25)
    wait_for(lambda: h.fenced.checkpoint.get(TOPIC) == {0: 25}, "its rows committed")
    assert Waiting.TOPIC_MISSING not in kinds(leader)
    assert leader.stalled_for(time.monotonic()) < 1.0


def test_kafka_unreachable_is_a_named_wait_while_recovering_and_heals(
    tmp_path: Path, leaders: list[PipelineLeader], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("hakafka.pipeline.lane_reader.METADATA_RETRY_S", 0.05)
    _topic, h = one_partition(tmp_path, 10)
    h.kafka_unreachable = "Local: All broker connections are down"
    leader = start(h, leaders)
    wait_for(lambda: Waiting.KAFKA_UNREACHABLE in kinds(leader), "the Kafka wait")
    time.sleep(1.1)
    now = time.monotonic()
    assert leader.status.state is PipelineState.RECOVERING
    assert leader.stalled_for(now) >= 1.0
    reason = leader.stall_reason(now)
    assert reason.startswith("kafka_unreachable for 1 s: Kafka unreachable: topic events: ")
    assert reason.endswith("All broker connections are down")

    h.consumers[-1].unreachable = None
    wait_for(lambda: h.fenced.checkpoint.get(TOPIC) == {0: 10}, "its rows committed")
    assert kinds(leader) == set()
    assert leader.status.state.value == "consuming"  # (mypy narrowed it to RECOVERING above)


def test_time_suspended_counts_as_no_progress(
    tmp_path: Path, leaders: list[PipelineLeader]
) -> None:
    topic, h = one_partition(tmp_path, 0)
    leader = start(h, leaders)
    wait_for(lambda: leader.status.state is PipelineState.CONSUMING, "consuming")
    leader.suspend()
    time.sleep(1.1)
    now = time.monotonic()
    assert leader.stalled_for(now) >= 1.0
    assert leader.stall_reason(now).startswith("suspended for 1 s: ZooKeeper connection lost")
    leader.resume()
    assert kinds(leader) == set() and leader.stalled_for(time.monotonic()) < 1.0
    topic.produce(0, 5)
    wait_for(lambda: h.fenced.checkpoint.get(TOPIC) == {0: 5}, "its rows committed")


def test_a_new_term_with_data_waiting_counts_from_the_shards_last_checkpoint(
    tmp_path: Path, leaders: list[PipelineLeader]
) -> None:
    # The previous leader committed 40 s ago and died; data kept arriving. The new term is
    # not "fresh": the shard has stood still since that checkpoint, until this term commits.
    _topic, h = one_partition(tmp_path, 30)
    h.fenced.committed_at = time.time() - 40.0
    h.sink.gate.clear()  # the first flush hangs (a Spark that takes its time to start)
    leader = start(h, leaders)
    wait_for(lambda: h.sink.attempts >= 1, "the first flush under way")
    now = time.monotonic()
    assert leader.stalled_for(now) >= 40.0
    assert leader.stall_reason(now).startswith("checkpoint_overdue for 4")
    h.sink.gate.set()
    wait_for(lambda: h.fenced.checkpoint.get(TOPIC) == {0: 30}, "the first commit")
    assert Waiting.CHECKPOINT_OVERDUE not in kinds(leader)
    assert leader.stalled_for(time.monotonic()) < 5.0


def test_empty_polls_before_the_first_fetch_do_not_end_an_overdue_checkpoint(
    tmp_path: Path, leaders: list[PipelineLeader]
) -> None:
    # A new leader's first polls come back empty while its fetches are under way: the lag
    # is unknown then, not zero. Seen in the chaos run: the overdue wait dropped at once, so
    # a shard stood still for 41 s while its leader said ready.
    _topic, h = one_partition(tmp_path, 30)
    h.fenced.committed_at = time.time() - 40.0
    h.unfetched_polls = 20
    h.sink.gate.clear()
    leader = start(h, leaders)
    wait_for(lambda: h.sink.attempts >= 1, "the first flush under way")
    assert Waiting.CHECKPOINT_OVERDUE in kinds(leader)
    assert leader.stalled_for(time.monotonic()) >= 40.0
    h.sink.gate.set()
    wait_for(lambda: h.fenced.checkpoint.get(TOPIC) == {0: 30}, "the first commit")
    assert Waiting.CHECKPOINT_OVERDUE not in kinds(leader)


def test_a_block_between_its_seal_and_its_flush_still_owes_the_checkpoint(
    tmp_path: Path, leaders: list[PipelineLeader], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Once sealed, a block's rows are no longer in the buffer. If the block was not yet in
    # flight, an empty poll then took the shard for caught up and dropped the overdue wait:
    # make test's chaos run saw a shard stand still 38-44 s while its leader said ready.
    from hakafka.pipeline.blockplan import plan_block

    planned: list[bool] = []

    def slow_plan(*args: Any, **kwargs: Any) -> Any:
        time.sleep(1.0)  # the consume lane polls (empty) meanwhile
        planned.append(True)
        return plan_block(*args, **kwargs)

    monkeypatch.setattr("hakafka.pipeline.flush.plan_block", slow_plan)
    _topic, h = one_partition(tmp_path, 30)
    h.fenced.committed_at = time.time() - 40.0
    h.sink.gate.clear()
    leader = start(h, leaders)
    wait_for(lambda: bool(planned), "the block planned")
    assert Waiting.CHECKPOINT_OVERDUE in kinds(leader)
    assert leader.stalled_for(time.monotonic()) >= 40.0
    h.sink.gate.set()
    wait_for(lambda: h.fenced.checkpoint.get(TOPIC) == {0: 30}, "the first commit")


def test_a_quiet_topic_is_no_stall_however_old_its_last_checkpoint(
    tmp_path: Path, leaders: list[PipelineLeader]
) -> None:
    _topic, h = one_partition(tmp_path, 0)
    h.fenced.committed_at = time.time() - 3600.0  # the last message came an hour ago
    leader = start(h, leaders)
    wait_for(lambda: leader.status.state is PipelineState.CONSUMING, "consuming")
    wait_for(lambda: Waiting.CHECKPOINT_OVERDUE not in kinds(leader), "nothing owed")
    assert leader.stalled_for(time.monotonic()) < 5.0


def test_metadata_failing_right_after_the_assignment_is_retried_not_a_failure(
    tmp_path: Path, leaders: list[PipelineLeader], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The assignment read metadata (no topic yet); the look for the topic right after it
    # finds Kafka gone: a metadata error like any other, retried, not a failed pipeline.
    monkeypatch.setattr("hakafka.pipeline.lane_reader.METADATA_RETRY_S", 0.05)
    calls = []
    answer = FakeConsumer.topic_partitions

    def flaky(self: FakeConsumer) -> list[int]:
        calls.append(1)
        if len(calls) == 2:
            raise KafkaMetadataError("topic events: metadata request failed: broker down")
        return answer(self)

    monkeypatch.setattr(FakeConsumer, "topic_partitions", flaky)
    h = Harness(tmp_path, pipeline_config(), Topic(partitions=0))
    leader = start(h, leaders)
    wait_for(lambda: Waiting.TOPIC_MISSING in kinds(leader), "the topic wait")
    assert leader.status.state is PipelineState.CONSUMING and leader.status.error is None
