"""The recent past the status page charts (`/status/history`): a bounded ring of samples.

Every `SAMPLE_EVERY_S` the main loop records, per pipeline of each shard this node leads,
its total Kafka lag and the rows consumed and flushed so far by this process (the
`hakafka_consumed_rows` and `hakafka_flush_rows` counters); the page derives rows/s from two
samples. `KEEP_S` of samples are kept, so a page opened late still draws the last minutes.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from prometheus_client import CollectorRegistry

from hakafka.daemon.shard import ShardRunner

SAMPLE_EVERY_S = 5.0
KEEP_S = 600.0


@dataclass(frozen=True)
class PipelinePoint:
    """One pipeline of one shard at one instant."""

    pipeline: str
    shard: int
    lag: int  # messages behind the high watermarks, every partition
    consumed_rows: int  # decoded from Kafka by this process, ever (a counter)
    flushed_rows: int  # written to ClickHouse by this process, ever (a counter)


@dataclass(frozen=True)
class Sample:
    at: float  # wall clock, seconds since the epoch
    pipelines: tuple[PipelinePoint, ...]


class StatusHistory:
    """The last `keep_s` seconds of samples, one per `every_s`; safe to read from any thread
    while the main loop writes."""

    def __init__(self, every_s: float = SAMPLE_EVERY_S, keep_s: float = KEEP_S) -> None:
        self.every_s = every_s
        self.keep_s = keep_s
        self._samples: deque[Sample] = deque(maxlen=int(keep_s // every_s) + 1)
        self._lock = threading.Lock()
        self._next = 0.0  # monotonic time the next sample is due

    def due(self, now: float) -> bool:
        """True when a sample is due at monotonic time `now`; the next is then due `every_s`
        later (a late loop does not make samples pile up)."""
        if now < self._next:
            return False
        self._next = now + self.every_s
        return True

    def add(self, sample: Sample) -> None:
        with self._lock:
            self._samples.append(sample)

    def samples(self) -> list[Sample]:
        """Oldest first."""
        with self._lock:
            return list(self._samples)

    def report(self) -> dict[str, Any]:
        """What `/status/history` returns."""
        return {
            "every_s": self.every_s,
            "keep_s": self.keep_s,
            "samples": [
                {"at": s.at, "pipelines": [asdict(p) for p in s.pipelines]} for s in self.samples()
            ],
        }


def sample_of(runners: Sequence[ShardRunner], registry: CollectorRegistry) -> Sample:
    """Now, for every pipeline of every shard in `runners` (those this node leads)."""
    points = []
    for runner in runners:
        for p in runner.pipelines:
            labels = {"pipeline": p.config.name, "shard": str(runner.shard)}
            consumed = registry.get_sample_value("hakafka_consumed_rows_total", labels)
            flushed = registry.get_sample_value("hakafka_flush_rows_total", labels)
            points.append(
                PipelinePoint(
                    pipeline=p.config.name,
                    shard=runner.shard,
                    lag=sum(p.lag().values()),
                    consumed_rows=int(consumed or 0),
                    flushed_rows=int(flushed or 0),
                )
            )
    return Sample(time.time(), tuple(points))
