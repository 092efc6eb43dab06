"""Read exact offset ranges back from Kafka and decode them, for a pending re-flush.

Kafka data is immutable, so decoding the same offsets with the same decoder gives the same
rows and dead letters the old leader buffered: the re-flushed block gets the same tasks and
deduplication tokens.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import pyarrow as pa

from buffer import OffsetRange
from hakafka.consumer import Decoder, OutOfRange, PartitionConsumer
from hakafka.consumer.messages import KafkaMessage
from hakafka.consumer.partition_consumer import OffsetReset


class RefetchError(RuntimeError):
    """The ranges stopped arriving (names the partitions still short)."""


@dataclass(frozen=True)
class KafkaRefetch:
    """Re-reads offset ranges of `topic` with a short-lived consumer of its own.

    Offsets below the log start (past retention) follow `out_of_range` like consumption does:
    `fail` raises OffsetOutOfRangeError naming them; `earliest` re-reads what is left (the
    consumer logs what was skipped). Ranges are in consumer positions: a partition is done
    when its position passes the range's end, even if the last offsets hold no message
    (transaction markers, compacted offsets). A read gives up only after `stall_s` seconds
    without progress, so a block of any size can be re-read.
    """

    bootstrap: str
    topic: str
    settings: Mapping[str, str]
    out_of_range: OutOfRange = OutOfRange.FAIL
    on_reset: Callable[[OffsetReset], None] | None = None
    """Told of offsets skipped under `earliest` (the consumer's skipped-offsets metric)."""
    stall_s: float = 60.0
    make_consumer: Callable[[KafkaRefetch, list[int]], RefetchConsumer] | None = None
    """Tests pass a fake; by default a PartitionConsumer of the given partitions."""

    def _consumer(self, partitions: list[int]) -> RefetchConsumer:
        if self.make_consumer is not None:
            return self.make_consumer(self, partitions)
        return PartitionConsumer(
            self.bootstrap,
            self.topic,
            partitions,
            settings=self.settings,
            out_of_range=self.out_of_range,
            group_id="hakafka-refetch",
            on_reset=self.on_reset,
        )

    def __call__(
        self, ranges: Mapping[int, OffsetRange], decoder: Decoder, step: Callable[[], None]
    ) -> tuple[pa.Table, pa.Table | None]:
        """The decoded rows and dead letters of exactly `ranges` (partition -> inclusive
        range); RefetchError if they stop arriving for `stall_s` seconds. `step` is called
        on every poll."""
        consumer = self._consumer(sorted(ranges))
        rows: list[pa.RecordBatch] = []
        dead: list[pa.RecordBatch] = []
        try:
            consumer.assign({p: rng.first for p, rng in ranges.items()})
            # Next offset to read per partition. A range may end in offsets that hold no
            # message (a transaction marker, a compacted offset): a partition is done once
            # the consumer's position passes its range, not when its last offset arrives.
            # `earliest` may have moved a start past the wanted range (all of it expired).
            reached = {p: rng.first for p, rng in ranges.items()}
            done: set[int] = set()
            deadline = time.monotonic() + self.stall_s
            while True:
                positions = consumer.position()
                moved = False
                for partition, rng in ranges.items():
                    position = positions.get(partition, reached[partition])
                    if position > reached[partition]:
                        reached[partition], moved = position, True
                    if reached[partition] > rng.last and partition not in done:
                        done.add(partition)
                        consumer.pause([partition])
                if len(done) == len(ranges):
                    break
                if moved:
                    deadline = time.monotonic() + self.stall_s
                step()
                if time.monotonic() > deadline:
                    short = {
                        p: (reached[p], rng.last) for p, rng in ranges.items() if p not in done
                    }
                    raise RefetchError(
                        f"topic {self.topic}: no wanted offset arrived for {self.stall_s:.0f} s; "
                        f"partition -> (next, last wanted): {short}"
                    )
                wanted = []
                for message in consumer.consume(10_000, 0.5):
                    got, offset = message.partition(), message.offset()
                    assert got is not None and offset is not None
                    if offset <= ranges[got].last:
                        wanted.append(message)
                if wanted:
                    decoded = decoder.decode(wanted)
                    rows.append(decoded.rows)
                    if decoded.dead_letters is not None:
                        dead.append(decoded.dead_letters)
        finally:
            consumer.close()
        schema = decoder.schema.arrow_schema()
        dead_table = pa.Table.from_batches(dead) if dead else None
        return pa.Table.from_batches(rows, schema=schema), dead_table


class RefetchConsumer(Protocol):
    """What the re-fetch asks of its consumer (PartitionConsumer)."""

    def assign(self, start_offsets: Mapping[int, int]) -> list[int]: ...

    def position(self) -> dict[int, int]: ...

    def consume(self, num_messages: int, timeout: float) -> Sequence[KafkaMessage]: ...

    def pause(self, partitions: Iterable[int] | None = None) -> None: ...

    def close(self) -> None: ...
