"""A pipeline's memory: its rows and its dead letters, appended and sealed together.

Both halves of a consumed batch go in under one lock and are sealed together, so a sealed
`PipelineBlock` holds exactly the good rows and the dead letters of the same messages. The
block's id (a digest of the offset ranges of every message, good and bad) names both halves
in their ClickHouse deduplication tokens.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import pyarrow as pa

from buffer import Block, BufferFull, BufferStats, Catalog, MemoryTable, OffsetRange
from buffer.table import batch_nbytes, block_id_for

Ranges = dict[tuple[str, int], OffsetRange]
_UNLIMITED = 1 << 62


@dataclass(frozen=True)
class ArrowBlock:
    """Arrow rows to flush under a block id (what `spark_bridge.flush.flush` takes)."""

    block_id: str
    table: pa.Table

    def to_table(self) -> pa.Table:
        return self.table


@dataclass(frozen=True)
class PipelineBlock:
    """A sealed block: the rows, the dead letters of the same messages, and their offsets."""

    block_id: str
    ranges: Ranges
    rows: ArrowBlock
    dead_letters: ArrowBlock | None
    sealed: tuple[Block, Block | None] | None
    """The buffer blocks to commit; None for a block rebuilt outside the buffer."""

    @property
    def row_count(self) -> int:
        return int(self.rows.table.num_rows)

    @property
    def dead_count(self) -> int:
        return 0 if self.dead_letters is None else int(self.dead_letters.table.num_rows)


def make_block(
    block_id: str, ranges: Ranges, rows: pa.Table, dead: pa.Table | None
) -> PipelineBlock:
    """A block rebuilt outside the buffer (a pending re-flush from the WAL or Kafka)."""
    dead_block = ArrowBlock(block_id, dead) if dead is not None and dead.num_rows else None
    return PipelineBlock(block_id, ranges, ArrowBlock(block_id, rows), dead_block, sealed=None)


class PipelineBuffer:
    """The rows table (queryable as `<pipeline>`) and the dead-letter table of one pipeline."""

    def __init__(
        self, name: str, rows_schema: pa.Schema, dead_schema: pa.Schema, limit_bytes: int
    ) -> None:
        self.name = name
        self.limit_bytes = limit_bytes
        # The limit applies to both halves together (here), so neither table refuses alone.
        self.rows = MemoryTable(name, rows_schema, _UNLIMITED)
        self.dead = MemoryTable(f"{name}_dead_letter", dead_schema, _UNLIMITED)
        self._lock = threading.Lock()

    def serve(self, catalog: Catalog, shard: int) -> None:
        """Make both tables queryable in `catalog` as `shard`'s part of their names, both or
        neither: ValueError while another instance's tables hold them."""
        catalog.add(self.rows, shard)
        try:
            catalog.add(self.dead, shard)
        except ValueError:
            catalog.discard(self.rows)
            raise

    def unserve(self, catalog: Catalog) -> None:
        """No longer serve the tables (another shard's parts of their names stay)."""
        catalog.discard(self.rows)
        catalog.discard(self.dead)

    def append(self, rows: pa.RecordBatch, dead: pa.RecordBatch | None, ranges: Ranges) -> None:
        """Append one consumed batch, both halves or neither.

        Raises buffer.BufferFull (nothing appended) when the pipeline would pass
        `limit_bytes`; an empty buffer accepts any one batch so the consumer cannot stall.
        """
        dead = dead if dead is not None and dead.num_rows else None
        size = batch_nbytes(rows) + (batch_nbytes(dead) if dead is not None else 0)
        with self._lock:
            held = self.rows.nbytes + self.dead.nbytes
            if held > 0 and held + size > self.limit_bytes:
                raise BufferFull(self.name, held, size, self.limit_bytes)
            self.rows.append(rows, ranges)
            if dead is not None:
                self.dead.append(dead, ranges)

    def stats(self) -> BufferStats:
        """The open part of both halves: dead letters alone also make a block worth flushing."""
        rows, dead = self.rows.stats(), self.dead.stats()
        starts = [t for t in (rows.oldest_append, dead.oldest_append) if t is not None]
        return BufferStats(
            rows=rows.rows + dead.rows,
            nbytes=rows.nbytes + dead.nbytes,
            oldest_append=min(starts) if starts else None,
        )

    @property
    def nbytes(self) -> int:
        return self.rows.nbytes + self.dead.nbytes

    def seal(self) -> PipelineBlock | None:
        """Seal everything appended so far into one block, or None if there is nothing."""
        with self._lock:
            rows = self.rows.seal()
            if rows is None:
                return None
            dead = self.dead.seal()
        ranges = dict(rows.ranges)
        block_id = block_id_for(ranges)
        dead_block = ArrowBlock(block_id, dead.to_table()) if dead is not None else None
        return PipelineBlock(
            block_id, ranges, ArrowBlock(block_id, rows.to_table()), dead_block, (rows, dead)
        )

    def commit(self, block: PipelineBlock) -> None:
        """Drop a block whose rows and dead letters are in ClickHouse."""
        if block.sealed is None:
            return
        rows, dead = block.sealed
        with self._lock:
            self.rows.commit(rows)
            if dead is not None:
                self.dead.commit(dead)
