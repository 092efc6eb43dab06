"""Offset bookkeeping for WAL replay, pending re-flush and WAL truncation (pure logic).

A pipeline reads one topic; its WAL holds one record per consumed batch with the exact
offset range per partition. Three questions are answered here, from record headers (the
rows of a record are decoded only where a caller needs them):

- replay: which offsets of each record go back into the buffer after a restart, given the
  checkpoint. Only offsets contiguous from the checkpoint are replayed: a gap in the WAL
  (offsets this node never consumed) ends replay for that partition, and consumption
  resumes from the gap.
- coverage: does the WAL hold every offset of a pending block, so it can be re-flushed
  from local data instead of being re-fetched from Kafka.
- truncation: the first record still needed after a checkpoint; segments wholly before it
  may be deleted.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from buffer import OffsetRange
from hakafka.consumer import ShardAssignment
from hakafka.coordination import Checkpoint, PendingIntent
from hakafka.coordination.writers import PUSH_TOPIC
from hakafka.pipeline.buffer import PipelineBlock, make_block
from hakafka.pipeline.push import kafka_only, topic_of
from hakafka.pipeline.walcodec import WalBatch, decode_header, ranges_of
from wal import Position, Record

# partition -> next offset to read; a pipeline reads one topic.
Offsets = dict[int, int]
PartitionRanges = Mapping[int, OffsetRange]


def checkpoint_offsets(
    checkpoint: Mapping[str, Mapping[str, int] | Mapping[int, int]], topic: str
) -> Offsets:
    """The `{partition: next_offset}` of `topic` and of the push writers (their partitions
    are negative: `push.py`) in a ZooKeeper checkpoint document."""
    return {
        int(p): int(o) for name in (topic, PUSH_TOPIC) for p, o in checkpoint.get(name, {}).items()
    }


class LayoutError(Exception):
    """This shard owns a partition whose checkpoint is in another shard."""


def check_layout(
    topic: str,
    shard: int,
    mine: Mapping[int, int],
    elsewhere: Mapping[int, Checkpoint],
    assignment: ShardAssignment,
) -> None:
    """LayoutError if a partition `shard` owns (`assignment`) has no checkpoint here (`mine`)
    but one in another shard: it would be read again from its low watermark (duplicates)."""
    for other, checkpoint in sorted(elsewhere.items()):
        for partition, offset in sorted(kafka_only(checkpoint_offsets(checkpoint, topic)).items()):
            if partition not in mine and assignment.select([partition]):
                raise LayoutError(
                    f"partition {partition} of {topic} belongs to shard {shard} in "
                    f"this config, but its checkpoint ({offset}) is in shard {other}: the "
                    "layout changed without `hakafka reshard`, which moves checkpoints; "
                    "restore the recorded layout, then run hakafka reshard with this one"
                )


@dataclass
class ReplayCursor:
    """Walks WAL records in order and says which offsets of each to replay.

    Starts from the checkpoint. A partition without a checkpoint starts at the first offset
    the WAL has for it (consumption of such a partition began at its earliest offset).
    Record ranges are consumer positions, so records follow each other without a hole even
    across offsets that hold no message (transaction markers, compacted offsets); a hole is
    offsets this node never consumed.
    """

    next_offsets: Offsets
    closed: set[int] = field(default_factory=set)

    def accept(self, ranges: PartitionRanges) -> dict[int, OffsetRange]:
        """The sub-ranges of `ranges` to replay (possibly empty); advances the cursor."""
        keep: dict[int, OffsetRange] = {}
        for partition, rng in sorted(ranges.items()):
            if partition in self.closed:
                continue
            start = self.next_offsets.setdefault(partition, rng.first)
            if rng.last < start:
                continue  # already flushed (below the checkpoint) or replayed
            if rng.first > start:
                self.closed.add(partition)  # a gap: Kafka has what the WAL lacks
                continue
            keep[partition] = OffsetRange(start, rng.last)
            self.next_offsets[partition] = rng.last + 1
        return keep


def covers(records: Iterable[PartitionRanges], wanted: PartitionRanges) -> bool:
    """True if the union of `records` contains every offset of every range in `wanted`."""
    pieces: dict[int, list[OffsetRange]] = {}
    for ranges in records:
        for partition, rng in ranges.items():
            if partition in wanted:
                pieces.setdefault(partition, []).append(rng)
    for partition, need in wanted.items():
        reach = need.first  # everything before `reach` is covered
        for rng in sorted(pieces.get(partition, [])):
            if rng.first > reach:
                break
            reach = max(reach, rng.last + 1)
            if reach > need.last:
                break
        if reach <= need.last:
            return False
    return True


@dataclass
class PendingScan:
    """A pending block's rows gathered during recovery's one pass over the WAL.

    Every record's ranges are `note`d (coverage needs them all); the decoded rows of those
    that hold some pending offset are kept (`wants` says which). `rows` answers once: the
    block's rows and dead letters if the records seen so far cover every wanted offset,
    else None (the block is re-read from Kafka). Either answer is correct; the WAL's is
    cheaper, and holds what Kafka's retention may already have dropped.
    """

    topic: str
    wanted: PartitionRanges
    _held: list[PartitionRanges] = field(default_factory=list)
    _batches: list[WalBatch] = field(default_factory=list)

    def wants(self, ranges: PartitionRanges) -> bool:
        """Whether a record with `ranges` holds some offset of the pending block."""
        return any(p in self.wanted and overlap(r, self.wanted[p]) for p, r in ranges.items())

    def note(self, ranges: PartitionRanges, batch: WalBatch | None) -> None:
        """A record's ranges, with its decoded rows if `wants` said it holds pending offsets."""
        self._held.append(ranges)
        if batch is not None:
            self._batches.append(batch)

    def rows(self, rows_schema: pa.Schema) -> tuple[pa.Table, pa.Table | None] | None:
        """The pending block's (rows, dead letters) from the records noted, or None if they
        lack some of its offsets."""
        if not covers(self._held, self.wanted):
            return None
        return pending_rows(self._batches, self.topic, self.wanted, rows_schema)


@dataclass(frozen=True)
class PendingFromWal:
    """What recovery's WAL pass gathers for a pending block (`scan`), and where it hands
    the block over to the flush lane (`block`)."""

    block_id: str
    scan: PendingScan
    block: Future[PipelineBlock | None]

    def hand_over(self, rows_schema: pa.Schema, topic: str) -> None:
        """Give the flush lane the block from the records seen (None: it re-reads Kafka)."""
        found = self.scan.rows(rows_schema)
        wanted = {(topic_of(p, topic), p): rng for p, rng in self.scan.wanted.items()}
        self.block.set_result(None if found is None else make_block(self.block_id, wanted, *found))


def overlap(a: OffsetRange, b: OffsetRange) -> OffsetRange | None:
    """The offsets `a` and `b` share, or None."""
    first, last = max(a.first, b.first), min(a.last, b.last)
    return OffsetRange(first, last) if first <= last else None


def record_ranges(record: Record, topic: str) -> dict[int, OffsetRange]:
    """The offset range per partition of `topic` and of the push writers that a WAL record
    holds (its header only)."""
    return {
        p: rng
        for (t, p), rng in ranges_of(decode_header(record)).items()
        if t in (topic, PUSH_TOPIC)
    }


def pending_ranges(intent: PendingIntent, topic: str) -> dict[int, OffsetRange]:
    """The inclusive offset range per partition of a pending block (the intent stores
    `[first, end)`)."""
    return {
        p: OffsetRange(first, end - 1)
        for name in (topic, PUSH_TOPIC)
        for p, (first, end) in intent.ranges.get(name, {}).items()
        if end > first
    }


def pending_rows(
    batches: Iterable[WalBatch],
    topic: str,
    wanted: PartitionRanges,
    rows_schema: pa.Schema,
) -> tuple[pa.Table, pa.Table | None]:
    """The rows and dead letters of exactly `wanted` found in `batches` (WAL records, in
    order): each (`_partition`, `_offset`) once, sorted by them."""
    rows, dead = [], []
    for batch in batches:
        keep = {
            p: shared
            for (t, p), rng in batch.ranges.items()
            if t in (topic, PUSH_TOPIC)
            and p in wanted
            and (shared := overlap(rng, wanted[p])) is not None
        }
        if keep:
            rows.append(select_rows(batch.rows, keep))
            if batch.dead_letters is not None:
                dead.append(select_rows(batch.dead_letters, keep))
    # Several WAL records may hold the same offsets (consumed again after a gap): keep one.
    table = dedup_offsets(pa.Table.from_batches(rows, schema=rows_schema))
    dead_table = dedup_offsets(pa.Table.from_batches(dead)) if dead else None
    return table, dead_table


def dedup_offsets(table: pa.Table) -> pa.Table:
    """Rows with distinct (`_partition`, `_offset`), first occurrence kept, sorted."""
    if table.num_rows == 0:
        return table
    table = table.sort_by([("_partition", "ascending"), ("_offset", "ascending")])
    p = table.column("_partition").combine_chunks()
    o = table.column("_offset").combine_chunks()
    if len(p) < 2:
        return table
    same = pc.and_(pc.equal(p[1:], p[:-1]), pc.equal(o[1:], o[:-1]))
    keep = pc.invert(pc.fill_null(same, False))
    mask = pa.concat_arrays([pa.array([True]), keep])
    return table.filter(mask)


def select_rows(batch: pa.RecordBatch, keep: PartitionRanges) -> pa.RecordBatch:
    """The rows of `batch` whose (`_partition`, `_offset`) fall in `keep`, in their order."""
    if not keep or batch.num_rows == 0:
        return batch.slice(0, 0)
    partition = batch.column("_partition")
    offset = batch.column("_offset")
    mask = None
    for p, rng in keep.items():
        clause = pc.and_(
            pc.equal(partition, p),
            pc.and_(pc.greater_equal(offset, rng.first), pc.less_equal(offset, rng.last)),
        )
        mask = clause if mask is None else pc.or_(mask, clause)
    return batch.filter(mask)


class WalIndex:
    """Positions and offset ranges of the WAL records this pipeline may still need.

    Safe to share between the consume thread (adds) and the flush thread (truncates)."""

    def __init__(self) -> None:
        self._entries: list[tuple[Position, PartitionRanges]] = []
        self._lock = threading.Lock()

    def add(self, position: Position, ranges: PartitionRanges) -> None:
        with self._lock:
            self._entries.append((position, ranges))

    def truncation_point(self, committed: Mapping[int, int]) -> Position | None:
        """A position such that every record before it is wholly below `committed`.

        It is the first record that still has an offset at or past `committed` (or the last
        record, when none has); entries before it are forgotten. None if nothing is indexed.
        """
        with self._lock:
            entries = self._entries
            if not entries:
                return None
            cut = len(entries) - 1
            for i, (_, ranges) in enumerate(entries):
                if any(rng.last >= committed.get(p, 0) for p, rng in ranges.items()):
                    cut = i
                    break
            del entries[:cut]
            return entries[0][0]
