"""`IdleLag`: the Kafka lag of pipelines that a led shard runs no consumer for.

An ops-paused pipeline runs in no term, and a drained one (a reshard in progress) has no
consumer: without this, their `hakafka_kafka_lag` series would vanish while they hold, and a
lag alert would look at an absent series. Their lag is the high watermark minus the
checkpoint, per partition the shard owns, read every `REFRESH_S` on this reader's own thread
(Kafka and ZooKeeper may be slow; the main loop only copies the last answer).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import structlog

from hakafka.config import Config, PipelineConfig
from hakafka.consumer.topic_offsets import TopicOffsets, Watermarks
from hakafka.daemon.shard import ShardRunner
from hakafka.pipeline import PipelineState
from hakafka.settings import shard_assignment

log = structlog.get_logger("hakafka.daemon")

REFRESH_S = 15.0

# (pipeline, shard) -> the next offset to read per partition the shard owns (checkpoint).
ReadCheckpoint = Callable[[PipelineConfig, int], Mapping[int, int]]
# (pipeline, shard) -> the watermarks of every partition the shard owns.
ReadWatermarks = Callable[[PipelineConfig, int], Mapping[int, Watermarks]]


def owned_watermarks(config: Config, pipeline: PipelineConfig, shard: int) -> dict[int, Watermarks]:
    """The watermarks of the partitions of `pipeline`'s topic that `shard` owns, read by a
    short-lived client (KafkaConsumeError when Kafka cannot answer)."""
    kafka = config.kafka
    with TopicOffsets(kafka.bootstrap, pipeline.topic, kafka.settings) as offsets:
        owned = shard_assignment(config, pipeline, shard).select(offsets.partitions())
        return offsets.watermarks(owned)


@dataclass(frozen=True)
class Idle:
    """A pipeline of a led shard that runs no consumer, and why."""

    shard: int
    pipeline: PipelineConfig
    why: str  # "paused" or "drained"


def idle_pipelines(
    runners: Sequence[ShardRunner], pipelines: Sequence[PipelineConfig]
) -> list[Idle]:
    """The pipelines of the shards this node leads that are paused by ops or drained."""
    found = []
    for runner in runners:
        if not runner.leading:
            continue
        drained = {
            p.config.name for p in runner.pipelines if p.status.state is PipelineState.DRAINED
        }
        for pipeline in pipelines:
            if pipeline.name in runner.paused:
                found.append(Idle(runner.shard, pipeline, "paused"))
            elif pipeline.name in drained:
                found.append(Idle(runner.shard, pipeline, "drained"))
    return found


class IdleLag:
    """Reads the lag of idle pipelines (see the module docstring) every `REFRESH_S`;
    `lags()` is the last answer: (pipeline name, shard) -> partition -> lag."""

    def __init__(
        self,
        idle: Callable[[], list[Idle]],
        checkpoint: ReadCheckpoint,
        watermarks: ReadWatermarks,
        *,
        refresh_s: float = REFRESH_S,
    ) -> None:
        self._idle, self._checkpoint, self._watermarks = idle, checkpoint, watermarks
        self._refresh_s = refresh_s
        self._lags: dict[tuple[str, int], dict[int, int]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="idle-lag", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self._refresh_s + 5.0)

    def lags(self) -> dict[tuple[str, int], dict[int, int]]:
        return dict(self._lags)

    def refresh(self) -> None:
        """Read the lag of every idle pipeline now; one that cannot be read keeps its last
        value (logged), one that is no longer idle is dropped."""
        lags: dict[tuple[str, int], dict[int, int]] = {}
        for idle in self._idle():
            key = (idle.pipeline.name, idle.shard)
            try:
                done = self._checkpoint(idle.pipeline, idle.shard)
                marks = self._watermarks(idle.pipeline, idle.shard)
            except Exception as exc:  # Kafka or ZooKeeper away: keep the last answer
                log.warning("idle_lag.read_failed", pipeline=key[0], shard=key[1], error=str(exc))
                if key in self._lags:
                    lags[key] = self._lags[key]
                continue
            # A partition without a checkpoint is read from its first offset.
            lags[key] = {p: max(0, m.high - done.get(p, m.low)) for p, m in marks.items()}
        self._lags = lags

    def _run(self) -> None:
        while not self._stop.wait(self._refresh_s):
            self.refresh()
