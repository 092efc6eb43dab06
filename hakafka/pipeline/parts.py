"""The parts a `PipelineLeader` is handed: small Protocols, so tests can pass in-memory fakes.

The daemon passes the real ones (a `PartitionConsumer` factory, `WriteAheadLog.open`, a Kafka
re-fetch, a `PipelineSink` flushing through Spark, the term's `FencedState`); the unit tests
of the flush / commit / backpressure protocol pass fakes and drive the races by hand.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import pyarrow as pa

from buffer import OffsetRange
from chlib.replicas import Replica
from hakafka.consumer import Decoder, OffsetReset, ShardAssignment
from hakafka.consumer.messages import KafkaMessage
from hakafka.coordination import Checkpoint, PendingIntent
from hakafka.pipeline.blockplan import PlannedBlock
from hakafka.pipeline.push import RecoveredBatch
from wal import Position, Record, RepairReport


class ConsumedMessage(KafkaMessage, Protocol):
    """A consumed message: what the decoders read, and its size (confluent_kafka.Message)."""

    def __len__(self) -> int: ...


class Consumer(Protocol):
    """The low-level consumer of the shard's partitions of one topic (PartitionConsumer).

    Called from the consume thread only (librdkafka handles are not shared)."""

    def assign(self, start_offsets: Mapping[int, int]) -> list[int]:
        """Assign the owned partitions metadata shows, from these offsets (others from the
        reset policy); keep every offset for a partition that appears later. Raises
        KafkaMetadataError when metadata cannot be read."""
        ...

    def consume(self, num_messages: int, timeout: float) -> Sequence[ConsumedMessage]: ...

    def refresh_partitions(self) -> list[int]:
        """Assign owned partitions that appeared (from their known offset); returns them."""
        ...

    def topic_partitions(self) -> list[int]:
        """Every partition of the topic per fresh metadata; [] if the topic does not exist.
        Raises KafkaMetadataError when metadata cannot be read."""
        ...

    def pause(self, partitions: Iterable[int] | None = None) -> None: ...

    def resume(self, partitions: Iterable[int] | None = None) -> None: ...

    def position(self) -> dict[int, int]: ...

    def lag(self) -> dict[int, int]: ...

    def close(self) -> None: ...


class Wal(Protocol):
    """The pipeline's write-ahead log (wal.WriteAheadLog)."""

    directory: Path
    repair_report: RepairReport

    def append(self, header: bytes, payload: bytes | bytearray | memoryview) -> Position: ...

    def sync(self) -> None: ...

    def replay(self, start: Position | None = None) -> Iterator[Record]: ...

    def truncate_before(self, position: Position) -> list[Path]: ...

    def close(self) -> None: ...


class Refetch(Protocol):
    """Reads exact offset ranges of the pipeline's topic back from Kafka, decoded."""

    def __call__(
        self, ranges: Mapping[int, OffsetRange], decoder: Decoder, step: Callable[[], None]
    ) -> tuple[pa.Table, pa.Table | None]:
        """The rows and dead letters of exactly `ranges`; calls `step` on every poll (it
        beats, and raises to end the read when the pipeline stops)."""
        ...


@dataclass(frozen=True)
class Flushed:
    """What ClickHouse acknowledged for one block."""

    rows: int
    dead_letters: int
    replica: str | None


class Sink(Protocol):
    """Where the pipeline's blocks go: its two ClickHouse tables on the shard's replicas."""

    def ensure_tables(self, replicas: tuple[Replica, ...]) -> None:
        """Create both tables where missing; raise if one exists with other columns."""
        ...

    def flush(self, block: PlannedBlock, replicas: tuple[Replica, ...]) -> Flushed:
        """Write the block's tasks idempotently (a task's token derives from its key, so
        the same tasks again add nothing); return once ClickHouse acknowledged every task,
        raise otherwise."""
        ...


class Fenced(Protocol):
    """The term's view of the pipeline's ZooKeeper state (coordination.FencedState): every
    write checks the epoch and raises FencedError once the term is over."""

    @property
    def epoch(self) -> int: ...

    def read_checkpoint(self, pipeline: str) -> Checkpoint: ...

    def checkpoint_age(self, pipeline: str) -> float | None:
        """Seconds since the checkpoint was last written, by any term (None: never)."""
        ...

    def read_other_checkpoints(self, pipeline: str) -> dict[int, Checkpoint]: ...

    def read_pending(self, pipeline: str) -> PendingIntent | None: ...

    def write_pending(self, pipeline: str, intent: PendingIntent) -> None: ...

    def commit_checkpoint(self, pipeline: str, offsets: Checkpoint) -> Checkpoint: ...

    def writer_number(self, pipeline: str, writer: str) -> int:
        """The push writer's number in the shard (the same for every term)."""
        ...


class OffsetsMirror(Protocol):
    """Shows each committed checkpoint elsewhere, for visibility only (a Kafka consumer
    group: `hakafka.consumer.GroupOffsets`); best effort, it never raises."""

    def publish(self, offsets: Mapping[int, int]) -> None: ...

    def close(self) -> None: ...


class LaneConsumerFactory(Protocol):
    """Makes a lane's consumer of `assignment`, calling `on_reset` for each offset reset (the
    lane forwards it: the counters live in the daemon)."""

    def __call__(
        self, assignment: ShardAssignment, *, on_reset: Callable[[OffsetReset], None]
    ) -> Consumer: ...


@dataclass(frozen=True)
class LaneParts:
    """How each lane process of a pipeline makes its consumer (of the lane's part of the
    shard) and its decoder, and how many lanes there are at most (each reads at least one
    partition). Pickled to the processes, so both are picklable callables (a
    `functools.partial` of module-level names)."""

    consumer: LaneConsumerFactory
    decoder: Callable[[], Decoder]
    count: int


class PushCopies(Protocol):
    """Copies of pushed batches on the shard's other nodes (`daemon/push_replicas.py`)."""

    def replicate(
        self, partition: int, sequence: int, rows: pa.RecordBatch, acks: int, trim: int
    ) -> Future[bool]:
        """Copy the batch; True once `acks` nodes hold it, False once they cannot. `trim`:
        the writer's checkpoint (older copies of it may go)."""
        ...

    def recover(self) -> list[RecoveredBatch]:
        """Every copy held of this pipeline's shard, on this node and the others."""
        ...


@dataclass(frozen=True)
class PipelineParts:
    """Everything outside the process a leader touches, handed in by the daemon."""

    consumer: Callable[[], Consumer]
    """Builds the term's consumer (called once, on the consume thread's start)."""
    open_wal: Callable[[], Wal]
    refetch: Refetch
    sink: Sink
    fenced: Fenced
    replicas: Callable[[], tuple[Replica, ...]]
    """The shard's ClickHouse replicas, asked again before each flush (replacements change)."""
    mirror: Callable[[], OffsetsMirror] | None = None
    """Builds the term's checkpoint mirror (on the flush thread's start); None: none."""
    lanes: LaneParts | None = None
    """Several lanes, each reading in a process of its own; None: one, in the pipeline
    thread, with `consumer`."""
    push_copies: PushCopies | None = None
    """Where pushed batches are copied before they are answered; None: answered once
    flushed (or, with `push_acks = 0`, once in the WAL)."""
