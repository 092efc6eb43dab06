"""The lag of pipelines a led shard runs no consumer for (paused by ops, drained during a
reshard) comes from the checkpoint and the high watermarks, so their lag series never
vanish while they hold; a read that fails keeps the last answer."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

from hakafka.config import PipelineConfig
from hakafka.consumer.topic_offsets import Watermarks
from hakafka.daemon.idle_lag import IdleLag, idle_pipelines
from hakafka.pipeline import PipelineState
from tests.pipeline.fakes import pipeline_config


@dataclass
class StandInPipeline:
    config: PipelineConfig
    state: PipelineState

    @property
    def status(self) -> Any:
        return self


@dataclass
class StandInRunner:
    shard: int
    leading: bool = True
    paused: frozenset[str] = frozenset()
    pipelines: list[StandInPipeline] = field(default_factory=list)


def test_paused_and_drained_pipelines_keep_a_lag_from_checkpoint_and_watermarks() -> None:
    pipeline = pipeline_config().pipelines[0]
    runners = [
        StandInRunner(0, paused=frozenset({pipeline.name})),
        StandInRunner(1, pipelines=[StandInPipeline(pipeline, PipelineState.DRAINED)]),
        StandInRunner(2, pipelines=[StandInPipeline(pipeline, PipelineState.CONSUMING)]),
        StandInRunner(3, leading=False, paused=frozenset({pipeline.name})),
    ]
    idle = idle_pipelines(cast(Any, runners), [pipeline])
    assert [(i.shard, i.why) for i in idle] == [(0, "paused"), (1, "drained")]

    checkpoints = {0: {0: 40}, 1: {1: 50}}
    marks = {0: {0: Watermarks(0, 100), 2: Watermarks(5, 50)}, 1: {1: Watermarks(0, 50)}}
    failing: set[int] = set()

    def watermarks(_pipeline: PipelineConfig, shard: int) -> dict[int, Watermarks]:
        if shard in failing:
            raise RuntimeError("Kafka unreachable")
        return marks[shard]

    reader = IdleLag(
        lambda: idle_pipelines(cast(Any, runners), [pipeline]),
        lambda _p, shard: checkpoints[shard],
        watermarks,
    )
    reader.refresh()
    # Partition 2 has no checkpoint: it is read from its first offset (5).
    assert reader.lags() == {(pipeline.name, 0): {0: 60, 2: 45}, (pipeline.name, 1): {1: 0}}

    marks[0][0] = Watermarks(0, 130)
    failing.add(1)
    reader.refresh()
    assert reader.lags() == {(pipeline.name, 0): {0: 90, 2: 45}, (pipeline.name, 1): {1: 0}}

    runners[0].paused = frozenset()  # resumed: it has a consumer and its own lag again
    reader.refresh()
    assert reader.lags() == {(pipeline.name, 1): {1: 0}}
