"""The daemon's metrics bound to one pipeline of one shard (labels `pipeline`, `shard`)."""

from __future__ import annotations

from hakafka.consumer import OffsetReset, OnError
from hakafka.metrics import Metrics
from hakafka.pipeline.buffer import PipelineBuffer


class PipelineMeters:
    """Every metric a pipeline's lanes move, with the pipeline's labels applied once."""

    def __init__(self, metrics: Metrics, pipeline: str, shard: int, on_error: OnError) -> None:
        self._m = metrics
        self._pipeline = pipeline
        self._shard = shard
        self._on_error = on_error
        self._labels = {"pipeline": pipeline, "shard": str(shard)}
        self._count_reset = metrics.consumer.resets_of(pipeline, shard)

    def consumed(
        self,
        *,
        rows: int,
        bad: int,
        dead_letters: int,
        message_bytes: int,
        wal_bytes: int,
        wal_seconds: float,
        synced: bool,
        lane: int,
    ) -> None:
        """One consumed batch read by `lane` (`rows` decoded, `bad` messages of which
        `dead_letters` went to the dead-letter table), appended to the WAL (and synced if
        `synced`)."""
        m, labels = self._m, self._labels
        m.consumed_bytes.labels(**labels).inc(message_bytes)
        m.consumed_rows.labels(**labels).inc(rows)
        m.lane_rows.labels(**labels, lane=str(lane)).inc(rows)
        m.wal_bytes.labels(**labels).inc(wal_bytes)
        m.wal_sync_seconds.labels(**labels).observe(wal_seconds)
        if synced:
            m.wal_syncs.labels(**labels).inc()
        if bad:
            m.consumer.count_bad(self._pipeline, self._shard, self._on_error, bad)
            if dead_letters:
                m.dead_letters.labels(**labels).inc(dead_letters)

    def pushed(self, rows: int) -> None:
        """A pushed batch of `rows` rows was applied (a retry is not counted again)."""
        self._m.pushed_rows.labels(**self._labels).inc(rows)

    def push_copied(self, copied: bool) -> None:
        """A pushed batch's copies came back: as `push_acks` asks (`copied`), or short."""
        outcome = "copied" if copied else "short"
        self._m.push_copies.labels(**self._labels, outcome=outcome).inc()

    def offset_reset(self, reset: OffsetReset) -> None:
        """A lane's consumer reset `reset.partition`'s offset (a lane process has no
        counters of its own; with one lane the consumer counts it itself)."""
        self._count_reset(reset)

    def offset_gap(self, partition: int, offsets: int) -> None:
        """`offsets` offsets of `partition` came without a message."""
        labels = {**self._labels, "partition": str(partition)}
        self._m.consumer.offset_gaps.labels(**labels).inc(offsets)

    def buffer(self, buffer: PipelineBuffer | None) -> None:
        """Publish what `buffer` holds; None: the buffer was released (0)."""
        rows = 0 if buffer is None else buffer.rows.row_count
        nbytes = 0 if buffer is None else buffer.nbytes
        self._m.buffer_rows.labels(**self._labels).set(rows)
        self._m.buffer_bytes.labels(**self._labels).set(nbytes)
        if buffer is not None:
            self._m.buffer_limit_bytes.labels(**self._labels).set(buffer.limit_bytes)

    def lanes(self, count: int) -> None:
        """The pipeline reads with `count` lanes (0: it is released)."""
        self._m.lanes.labels(**self._labels).set(count)

    def backpressure(self, paused: bool) -> None:
        self._m.backpressure.labels(**self._labels).set(1 if paused else 0)

    def flush_failed(self) -> None:
        self._m.flushes.labels(**self._labels, result="error").inc()

    def flushed(self, rows: int, seconds: float) -> None:
        m = self._m
        m.flushes.labels(**self._labels, result="ok").inc()
        m.flush_rows.labels(**self._labels).inc(rows)
        m.flush_seconds.labels(**self._labels).observe(seconds)
