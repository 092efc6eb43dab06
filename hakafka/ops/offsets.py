"""`hakafka offsets show|set` and `hakafka pending show|drop`: a pipeline's checkpoint and its
pending block, seen and changed by ops.

ZooKeeper's checkpoint is the source of truth for where a pipeline resumes. A change is made
only while the pipeline is paused and its leader has stopped it (`ops.pause.held`), in one
multi-op fenced by that leader's epoch (`PauseStore.move`): no flush can commit around it.
Every move is logged (`offsets.moved`, with before and after) and printed.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from enum import StrEnum

from hakafka.config import Config
from hakafka.consumer.topic_offsets import TopicOffsets, Watermarks
from hakafka.coordination import Coordinator, PendingIntent
from hakafka.coordination.fenced import StoredCheckpoint
from hakafka.coordination.pause import StoredPause, StoredPending
from hakafka.coordination.writers import PUSH_TOPIC
from hakafka.ops.cluster import OpsError, UsageError, format_table
from hakafka.ops.pause import held
from hakafka.settings import shard_assignment

_OFFSET_ITEM = re.compile(r"^\s*(\d+)\s*:\s*(\d+)\s*$")


class TargetKind(StrEnum):
    EARLIEST = "earliest"
    LATEST = "latest"
    TIMESTAMP = "timestamp"
    OFFSETS = "offsets"


@dataclass(frozen=True)
class OffsetTarget:
    """Where `offsets set` moves a pipeline: each owned partition to its earliest or latest
    offset, to the first offset at or after `timestamp_ms`, or the `offsets` named."""

    kind: TargetKind
    timestamp_ms: int = 0
    offsets: Mapping[int, int] = field(default_factory=dict)


def parse_offsets(text: str) -> dict[int, int]:
    """`0:100,3:250` -> {0: 100, 3: 250}; UsageError naming the bad item."""
    found: dict[int, int] = {}
    for item in text.split(","):
        match = _OFFSET_ITEM.match(item)
        if match is None:
            raise UsageError(
                f"--to-offset: {item.strip()!r} is not PARTITION:OFFSET (e.g. 0:1200,1:980)"
            )
        partition, offset = int(match.group(1)), int(match.group(2))
        if partition in found:
            raise UsageError(f"--to-offset: partition {partition} is named twice")
        found[partition] = offset
    return found


def parse_timestamp(text: str) -> int:
    """Milliseconds since the epoch of `text`: an integer (ms) or an ISO-8601 time (UTC when
    it has no offset); UsageError otherwise."""
    if text.isdigit():
        return int(text)
    try:
        moment = dt.datetime.fromisoformat(text)
    except ValueError:
        raise UsageError(
            f"--to-timestamp {text!r}: not an ISO-8601 time (2026-11-24T10:00:00Z) "
            "or milliseconds since the epoch"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return int(moment.timestamp() * 1000)


@dataclass(frozen=True)
class Move:
    """A checkpoint change of one shard's pipeline: next offset per partition before and
    after, and the pending block it abandoned."""

    shard: int
    pipeline: str
    topic: str
    before: dict[int, int]
    after: dict[int, int]
    dropped: PendingIntent | None
    dry_run: bool = False


def _owned(config: Config, offsets: TopicOffsets, pipeline: str, shard: int) -> list[int]:
    spec = config.pipeline(pipeline)
    return shard_assignment(config, spec, shard).select(offsets.partitions())


def _targets(
    target: OffsetTarget,
    owned: Sequence[int],
    marks: Mapping[int, Watermarks],
    offsets: TopicOffsets,
) -> dict[int, int]:
    if target.kind is TargetKind.EARLIEST:
        return {p: marks[p].low for p in owned}
    if target.kind is TargetKind.LATEST:
        return {p: marks[p].high for p in owned}
    if target.kind is TargetKind.TIMESTAMP:
        return offsets.at_time(owned, target.timestamp_ms, marks)
    foreign = sorted(set(target.offsets) - set(owned))
    if foreign:
        raise UsageError(
            f"--to-offset: partitions {foreign} are not in this shard (it owns {list(owned)})"
        )
    for partition, offset in sorted(target.offsets.items()):
        low, high = marks[partition].low, marks[partition].high
        if not low <= offset <= high:
            raise OpsError(
                f"--to-offset {partition}:{offset}: {offsets.topic}[{partition}] holds offsets "
                f"{low}..{high - 1} (next to be written: {high}); nothing changed"
            )
    return dict(target.offsets)


def block_summary(intent: PendingIntent) -> str:
    """`block b-12: 3000 rows, 2 dead letters (events[0] 100..3099)`."""
    rows = sum(t.rows for t in intent.tasks) if intent.tasks else None
    dead = sum(t.dead for t in intent.tasks) if intent.tasks else None
    spans = ", ".join(
        f"{topic}[{p}] {first}..{end - 1}"
        for topic, parts in sorted(intent.ranges.items())
        for p, (first, end) in sorted(parts.items())
    )
    counts = "rows unknown" if rows is None else f"{rows} rows, {dead} dead letters"
    return f"block {intent.block_id}: {counts} ({spans})"


def set_offsets(
    coordinator: Coordinator,
    config: Config,
    offsets: TopicOffsets,
    *,
    shard: int,
    pipeline: str,
    target: OffsetTarget,
    drop_pending: bool,
    by: str,
    timeout_s: float,
    dry_run: bool = False,
    allow_end: bool = False,
) -> Move:
    """Move `pipeline`'s checkpoint in `shard` to `target` (see the module docstring). Refused
    (OpsError, nothing changed) while a block is pending, unless `drop_pending`, and for a
    time after the newest message of every partition, unless `allow_end`. With `dry_run`
    nothing is paused or written: the Move says what would be done."""
    topic = config.pipeline(pipeline).topic
    owned = _owned(config, offsets, pipeline, shard)
    marks = offsets.watermarks(owned)
    wanted = _targets(target, owned, marks, offsets)
    if target.kind is TargetKind.TIMESTAMP and not allow_end:
        _refuse_past_newest(offsets, marks, target.timestamp_ms)

    def plan(pending: StoredPending | None, stored: StoredCheckpoint) -> Offsets:
        if pending is not None and not drop_pending:
            raise OpsError(
                f"shard {shard}, pipeline {pipeline}: {block_summary(pending.intent)} is pending "
                "(a flush in doubt); --drop-pending abandons it; nothing changed"
            )
        checkpoint = {t: dict(parts) for t, parts in stored.offsets.items()}
        checkpoint.setdefault(topic, {}).update(wanted)
        return checkpoint

    why = f"offsets set --to-{target.kind.value} by {by}"
    return _move(
        coordinator,
        shard,
        pipeline,
        topic,
        plan=plan,
        why=why,
        by=by,
        timeout_s=timeout_s,
        dry_run=dry_run,
    )


def _refuse_past_newest(offsets: TopicOffsets, marks: Mapping[int, Watermarks], at_ms: int) -> None:
    """OpsError when `at_ms` is later than the newest message of every partition of `marks`:
    every partition would move to its end, skipping all it holds (a mistyped year does it)."""
    newest = offsets.newest_timestamps(marks)
    if not newest or any(stamp >= at_ms for stamp in newest.values()):
        return
    listed = ", ".join(f"p{p} {_utc(stamp)}" for p, stamp in sorted(newest.items()))
    raise OpsError(
        f"--to-timestamp {_utc(at_ms)} is after the newest message of every partition "
        f"({listed}): each would move to its end, skipping every message not yet in "
        "ClickHouse; --to-latest says so, --allow-end does it anyway; nothing changed"
    )


def _utc(ms: int) -> str:
    return (
        dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat(timespec="milliseconds")[:-6] + "Z"
    )


def drop_pending(
    coordinator: Coordinator,
    config: Config,
    *,
    shard: int,
    pipeline: str,
    by: str,
    timeout_s: float,
    dry_run: bool = False,
) -> Move:
    """Abandon `pipeline`'s pending block in `shard`: its offsets are skipped (the checkpoint
    moves to the block's end) and the intent is deleted, in one fenced multi-op. With
    `dry_run` nothing is paused or written: the Move says what would be done."""
    topic = config.pipeline(pipeline).topic

    def plan(pending: StoredPending | None, stored: StoredCheckpoint) -> Offsets:
        if pending is None:
            raise OpsError(f"shard {shard}, pipeline {pipeline}: no block is pending")
        if pending.intent.ranges.get(PUSH_TOPIC):
            # Skipping them would answer the writers' retries as duplicates of rows that may
            # never have landed.
            raise OpsError(
                f"shard {shard}, pipeline {pipeline}: block {pending.intent.block_id} holds "
                "pushed rows; it cannot be dropped: the leader re-flushes it from its WAL, "
                "or, where the WAL lacks them, once their writers push them again (hakafka "
                "status names those it awaits)"
            )
        checkpoint = {t: dict(parts) for t, parts in stored.offsets.items()}
        for block_topic, parts in pending.intent.ranges.items():
            target = checkpoint.setdefault(block_topic, {})
            for partition, (_first, end) in parts.items():
                target[partition] = max(target.get(partition, end), end)
        return checkpoint

    why = f"pending drop by {by}"
    return _move(
        coordinator,
        shard,
        pipeline,
        topic,
        plan=plan,
        why=why,
        by=by,
        timeout_s=timeout_s,
        dry_run=dry_run,
    )


Offsets = dict[str, dict[int, int]]  # topic -> partition -> next offset


def _move(
    coordinator: Coordinator,
    shard: int,
    pipeline: str,
    topic: str,
    *,
    plan: Callable[[StoredPending | None, StoredCheckpoint], Offsets],
    why: str,
    by: str,
    timeout_s: float,
    dry_run: bool,
) -> Move:
    """Write the checkpoint `plan` makes of the pending block and the stored checkpoint (it
    raises OpsError to refuse), dropping the pending block, while the pipeline is held
    paused; with `dry_run`, read them without pausing and write nothing."""

    def moved(pause: StoredPause | None) -> Move:
        pending = coordinator.pauses.pending(shard, pipeline)
        stored = coordinator.pauses.checkpoint(shard, pipeline)
        checkpoint = plan(pending, stored)
        if pause is not None:
            coordinator.pauses.move(
                shard, pipeline, pause=pause, stored=stored, checkpoint=checkpoint, drop=pending
            )
        return Move(
            shard,
            pipeline,
            topic,
            before=dict(stored.offsets.get(topic, {})),
            after=dict(checkpoint.get(topic, {})),
            dropped=None if pending is None else pending.intent,
            dry_run=pause is None,
        )

    if dry_run:
        return moved(None)
    with held(coordinator, shard, pipeline, by=by, why=why, timeout_s=timeout_s) as pause:
        return moved(pause)


def describe_move(move: Move) -> str:
    """The move as printed: each partition's next offset before and after and what that does
    to its messages (skipped: never written by hakafka; re-read: written again unless
    ClickHouse already has them); a dry run says `would`."""
    verb = "would move" if move.dry_run else "moved"
    lines = [f"shard {move.shard}, pipeline {move.pipeline}: checkpoint of {move.topic} {verb}"]
    partitions = sorted(set(move.before) | set(move.after))
    table = format_table(
        ["PARTITION", "BEFORE", "AFTER", "EFFECT"],
        [
            [
                p,
                move.before.get(p),
                move.after.get(p),
                _effect(move.before.get(p), move.after.get(p)),
            ]
            for p in partitions
        ],
    )
    lines += ["  " + line for line in table.splitlines()]
    if move.dropped is not None:
        lines.append(
            f"{'would abandon' if move.dry_run else 'abandoned'} {block_summary(move.dropped)}: "
            "not written by hakafka (rows of it may already be in ClickHouse if a flush "
            "attempt reached it)"
        )
    if move.dry_run:
        lines.append("dry run: nothing paused or changed")
    return "\n".join(lines)


def _effect(before: int | None, after: int | None) -> str | None:
    """`skips 1200 (100..1299)`, `re-reads 300 (900..1199)` or None: what a partition moved
    from `before` to `after` does to the messages between them."""
    if before is None or after is None or before == after:
        return None
    low, high = sorted((before, after))
    verb = "skips" if after > before else "re-reads"
    return f"{verb} {high - low} offsets ({low}..{high - 1})"


@dataclass(frozen=True)
class PartitionOffsets:
    """One row of `offsets show`."""

    shard: int
    pipeline: str
    partition: int
    checkpoint: int | None
    low: int
    high: int
    pending: str | None  # the pending block's offsets in this partition
    paused: bool

    @property
    def lag(self) -> int:
        """Messages not yet in ClickHouse: from the checkpoint (or the log start) to the end."""
        return self.high - max(self.low, self.checkpoint if self.checkpoint is not None else 0)


def show_offsets(
    coordinator: Coordinator,
    config: Config,
    offsets_of: Mapping[str, TopicOffsets],
    shards: Sequence[int],
    pipelines: Sequence[str],
) -> list[PartitionOffsets]:
    """Checkpoint, watermarks, lag and pending span of every owned partition; `offsets_of`
    reads each pipeline's topic."""
    rows = []
    for shard in shards:
        for name in pipelines:
            topic_offsets = offsets_of[name]
            topic = config.pipeline(name).topic
            owned = _owned(config, topic_offsets, name, shard)
            marks = topic_offsets.watermarks(owned)
            stored = coordinator.pauses.checkpoint(shard, name).offsets.get(topic, {})
            pending = coordinator.pauses.pending(shard, name)
            spans = {} if pending is None else pending.intent.ranges.get(topic, {})
            paused = coordinator.pauses.read(shard, name) is not None
            for p in owned:
                span = spans.get(p)
                rows.append(
                    PartitionOffsets(
                        shard,
                        name,
                        p,
                        stored.get(p),
                        marks[p].low,
                        marks[p].high,
                        None
                        if span is None or pending is None
                        else f"{pending.intent.block_id} {span[0]}..{span[1] - 1}",
                        paused,
                    )
                )
    return rows


def render_offsets(rows: Sequence[PartitionOffsets]) -> str:
    """What `offsets show` prints: `rows` as a table, one line per partition."""
    return format_table(
        ["SHARD", "PIPELINE", "PARTITION", "CHECKPOINT", "LOW", "HIGH", "LAG", "PENDING", "PAUSED"],
        [
            [
                r.shard,
                r.pipeline,
                r.partition,
                r.checkpoint,
                r.low,
                r.high,
                r.lag,
                r.pending,
                "yes" if r.paused else "no",
            ]
            for r in rows
        ],
    )


def offsets_json(rows: Sequence[PartitionOffsets]) -> list[dict[str, object]]:
    """What `offsets show --json` prints: each row's fields and its `lag`."""
    return [{**asdict(r), "lag": r.lag} for r in rows]


def show_pending(
    coordinator: Coordinator, shards: Sequence[int], pipelines: Sequence[str]
) -> list[tuple[int, str, PendingIntent]]:
    """The pending blocks of `pipelines` in `shards`: (shard, pipeline, intent)."""
    found = []
    for shard in shards:
        for name in pipelines:
            if (pending := coordinator.pauses.pending(shard, name)) is not None:
                found.append((shard, name, pending.intent))
    return found


def describe_pending(found: Sequence[tuple[int, str, PendingIntent]]) -> str:
    """What `pending show` prints: one line per block of `found` (see `show_pending`) with
    its shard, pipeline and `block_summary`, or that no block is pending."""
    if not found:
        return "no block is pending"
    return "\n".join(
        f"shard {shard}, pipeline {name}: {block_summary(intent)}" for shard, name, intent in found
    )


def pending_json(found: Sequence[tuple[int, str, PendingIntent]]) -> list[dict[str, object]]:
    """What `pending show --json` prints: each block of `found` (see `show_pending`) as its
    shard, pipeline and the fields of its intent."""
    return [{"shard": s, "pipeline": n, **asdict(i)} for s, n, i in found]
