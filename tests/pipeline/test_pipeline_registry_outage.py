"""A schema registry that cannot answer is an outage of the consume lane: the same batch is
decoded again with backoff, `status` says why, and no good message becomes a dead letter."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from hakafka.consumer import DecodedBatch, Decoder, PipelineSchema
from hakafka.consumer.messages import KafkaMessage, MessageColumns
from hakafka.consumer.registry import RegistryUnavailableError
from hakafka.pipeline import PipelineLeader, PipelineState
from tests.pipeline.fakes import TOPIC, Harness, decoder_for, one_partition, wait_for


class RegistryAway:
    """A decoder whose schema registry is down until `back` is set; counts its attempts."""

    def __init__(self, decoder: Decoder) -> None:
        self.decoder = decoder
        self.back = threading.Event()
        self.attempts = 0

    @property
    def schema(self) -> PipelineSchema:
        return self.decoder.schema

    def decode(self, messages: Sequence[KafkaMessage]) -> DecodedBatch:
        self.attempts += 1
        if not self.back.is_set():
            raise RegistryUnavailableError("schema registry http://127.0.0.1:1 unreachable")
        return self.decoder.decode(messages)

    def decode_columns(self, columns: MessageColumns) -> DecodedBatch:
        raise AssertionError("the consume lane decodes messages")


def start_with_registry_away(
    h: Harness, leaders: list[PipelineLeader]
) -> tuple[PipelineLeader, RegistryAway]:
    away = RegistryAway(decoder_for(h.pipeline))
    leader = h.leader(decoder=away)
    leaders.append(leader)
    leader.start()
    return leader, away


def test_registry_outage_waits_reports_and_dead_letters_nothing(
    tmp_path: Path, leaders: list[PipelineLeader], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("hakafka.pipeline.lane_reader.REGISTRY_RETRY_S", 0.01)
    monkeypatch.setattr("hakafka.pipeline.lane_reader.REGISTRY_RETRY_MAX_S", 0.05)
    _topic, h = one_partition(tmp_path, 40)
    leader, away = start_with_registry_away(h, leaders)
    wait_for(lambda: away.attempts >= 4, "decode retries while the registry is away")
    time.sleep(0.3)
    assert leader.status.state is PipelineState.CONSUMING  # waiting, not failed
    assert "unreachable" in (leader.status.registry_error or "")
    assert leader.stalled_for(time.monotonic()) >= 0.3  # reported stuck if it lasts
    assert leader.buffer.rows.row_count == 0 and h.fenced.commits == 0
    assert h.sink.offsets() == [] and h.sink.dead_offsets() == []
    away.back.set()
    wait_for(lambda: h.fenced.checkpoint.get(TOPIC) == {0: 40}, "every offset committed")
    assert h.sink.offsets() == [(0, o) for o in range(40)]
    assert h.sink.dead_offsets() == []
    assert leader.status.registry_error is None
    assert leader.stalled_for(time.monotonic()) < 0.3


def test_a_stop_during_a_registry_outage_ends_the_wait(
    tmp_path: Path, leaders: list[PipelineLeader], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("hakafka.pipeline.lane_reader.REGISTRY_RETRY_S", 10.0)
    _topic, h = one_partition(tmp_path, 5)
    leader, away = start_with_registry_away(h, leaders)
    wait_for(lambda: away.attempts >= 1, "the first decode attempt")
    began = time.monotonic()
    assert leader.stop(2.0)
    assert time.monotonic() - began < 2.0
    assert leader.status.state is PipelineState.STOPPED
    assert h.fenced.commits == 0 and h.sink.dead_offsets() == []
