"""Read exact offset ranges back from Kafka and decode them, for a pending re-flush.

Kafka data is immutable, so decoding the same offsets with the same decoder gives the same
rows and dead letters the old leader buffered: the re-flushed block gets the same tasks and
deduplication tokens.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

import pyarrow as pa

from buffer import OffsetRange
from hakafka.consumer import Decoder, PartitionConsumer


class RefetchError(RuntimeError):
    """The ranges could not be read back in time (names the partitions still short)."""


@dataclass(frozen=True)
class KafkaRefetch:
    """Re-reads offset ranges of `topic` with a short-lived consumer of its own."""

    bootstrap: str
    topic: str
    settings: Mapping[str, str]
    timeout: float = 120.0

    def __call__(
        self, ranges: Mapping[int, OffsetRange], decoder: Decoder
    ) -> tuple[pa.Table, pa.Table | None]:
        """The decoded rows and dead letters of exactly `ranges` (partition -> inclusive
        range); RefetchError if they cannot be read within `timeout`."""
        consumer = PartitionConsumer(
            self.bootstrap,
            self.topic,
            sorted(ranges),
            settings=self.settings,
            group_id="hakafka-refetch",
        )
        rows: list[pa.RecordBatch] = []
        dead: list[pa.RecordBatch] = []
        reached = {p: rng.first for p, rng in ranges.items()}
        deadline = time.monotonic() + self.timeout
        try:
            consumer.assign({p: rng.first for p, rng in ranges.items()})
            while any(reached[p] <= rng.last for p, rng in ranges.items()):
                if time.monotonic() > deadline:
                    short = {
                        p: (reached[p], rng.last)
                        for p, rng in ranges.items()
                        if reached[p] <= rng.last
                    }
                    raise RefetchError(
                        f"topic {self.topic}: could not re-read offsets within "
                        f"{self.timeout:.0f} s; partition -> (next, last wanted): {short}"
                    )
                wanted = []
                for message in consumer.consume(10_000, 0.5):
                    partition, offset = message.partition(), message.offset()
                    assert partition is not None and offset is not None
                    if offset <= ranges[partition].last:
                        wanted.append(message)
                        reached[partition] = offset + 1
                    else:
                        reached[partition] = max(reached[partition], offset)
                        consumer.pause([partition])
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
