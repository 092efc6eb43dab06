"""Point-in-time views of a memory table."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa

if TYPE_CHECKING:
    from buffer.table import OffsetRange, TopicPartition


@dataclass(frozen=True, eq=False)
class Snapshot:
    """Whole appended batches of one table at one instant, with the offsets they hold.

    ``ranges`` gives per (topic, partition) the first and last offset (inclusive) held.
    To combine with ClickHouse without gaps or duplicates, read from ClickHouse the rows
    with ``_offset < ranges[tp].first`` for each partition in ``ranges`` (all rows for the
    others) and add the snapshot's rows: everything below a partition's first buffered
    offset has been committed to ClickHouse, everything from it on is in the snapshot.
    """

    name: str
    schema: pa.Schema
    batches: tuple[pa.RecordBatch, ...]
    ranges: Mapping[TopicPartition, OffsetRange]

    @property
    def watermark(self) -> dict[TopicPartition, int]:
        """Per (topic, partition) the last offset the snapshot holds (inclusive)."""
        return {tp: rng.last for tp, rng in self.ranges.items()}

    @property
    def rows(self) -> int:
        """Number of rows in the snapshot."""
        return sum(b.num_rows for b in self.batches)

    @property
    def nbytes(self) -> int:
        """Arrow buffer bytes the snapshot references."""
        return sum(int(b.get_total_buffer_size()) for b in self.batches)

    def to_table(self) -> pa.Table:
        """The snapshot as one Arrow table (zero-copy over its batches)."""
        return pa.Table.from_batches(self.batches, schema=self.schema)
