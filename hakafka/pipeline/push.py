"""Batches pushed into a pipeline by writers other than its Kafka consumer (the buffer as a
write cache): their place in the pipeline's offset space, their check against its columns,
and their way from a request thread to the pipeline thread and back as an acknowledgement.

Offset space. Rows, WAL records, blocks, task plans and flush tokens name data by
(partition, offset) alone. Kafka partitions are >= 0; a push writer is partition
-(1 + its number) (`coordination/writers.py` keeps the numbers), and row i of its batch with
sequence s is offset s * 2**SEQUENCE_BITS + i. So a pushed batch follows every step of the
Kafka path (WAL, replay, plan, tokens, checkpoint) as it is; only where a topic is named
(the pending intent and the checkpoint in ZooKeeper) do writers' partitions go under
PUSH_TOPIC. A record's range starts where the writer's previous batch ended, as a Kafka
record's starts at the consumer's previous position, so a writer's records are contiguous.

Exactly once per writer: a writer has one batch in flight and its sequences increase; a
batch whose first offset is below the writer's next one was applied already (a retry) and
is not applied again. A writer that breaks the one batch (two pushers with one writer id)
may have a batch applied after a higher one, which would then look like a retry: the
pipeline thread remembers each writer's last RECENT_SEQUENCES applied sequences, and a batch
below the writer's position whose sequence lies among them but is not one of them was never
applied. It is refused (PushOutOfOrderError, HTTP 409), not answered as a duplicate.

Acknowledged means no failover can lose it: a push is answered once a checkpoint covers it
(it is in ClickHouse), or before, once it is in the leader's WAL and copied to `push_acks`
other nodes (`durable`). Until its flush it is queryable in the buffer.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TypeVar

import pyarrow as pa
import pyarrow.compute as pc

from buffer.push_bounds import MAX_ROWS, MAX_SEQUENCE, SEQUENCE_BITS
from buffer.table import batch_nbytes
from hakafka.consumer import PipelineSchema
from hakafka.consumer.convert import ChunkError, convert_column
from hakafka.consumer.schema import ColumnSpec
from hakafka.coordination.writers import PUSH_TOPIC

RECENT_SEQUENCES = 64  # per writer, the applied sequences a term remembers (see the module)

V = TypeVar("V")


def writer_partition(number: int) -> int:
    """The partition of the writer numbered `number` (0, 1, ...): -1, -2, ..."""
    return -1 - number


def first_offset(sequence: int) -> int:
    """The offset of the first row of a batch with `sequence`."""
    return sequence << SEQUENCE_BITS


def topic_of(partition: int, topic: str) -> str:
    """Where `partition` is named: the pipeline's Kafka `topic`, or PUSH_TOPIC for a writer."""
    return PUSH_TOPIC if partition < 0 else topic


def by_topic(parts: Mapping[int, V], topic: str) -> dict[str, dict[int, V]]:
    """`parts` grouped under their topics (the Kafka `topic`, PUSH_TOPIC), those with any."""
    grouped: dict[str, dict[int, V]] = {}
    for partition, value in parts.items():
        grouped.setdefault(topic_of(partition, topic), {})[partition] = value
    return grouped


def kafka_only(parts: Mapping[int, V]) -> dict[int, V]:
    """The Kafka partitions of `parts` (writers left out)."""
    return {p: v for p, v in parts.items() if p >= 0}


class PushError(ValueError):
    """A pushed batch that does not fit the pipeline, refused whole (HTTP 400): the message
    names the column, the row and why."""


class PushedRowsMissingError(Exception):
    """A pending block holds pushed rows that no WAL of this node has and its intent does not
    list the batches to await from the writers; the message names the block and writers."""


Batch = tuple[int, int, int]
"""A pushed batch as a pending intent lists it: (partition, sequence, rows)."""


def pushed_batches(rows: pa.Table) -> tuple[Batch, ...]:
    """The pushed batches among a block's `rows`, by partition and sequence."""
    partitions = rows.column("_partition")
    mine = rows.filter(pc.less(partitions, 0))
    if mine.num_rows == 0:
        return ()
    sequences = pc.shift_right(mine.column("_offset"), SEQUENCE_BITS)
    counted = (
        pa.table({"p": mine.column("_partition"), "s": sequences})
        .group_by(["p", "s"])
        .aggregate([([], "count_all")])
    )
    found = zip(
        counted.column("p").to_pylist(),
        counted.column("s").to_pylist(),
        counted.column("count_all").to_pylist(),
        strict=True,
    )
    return tuple(sorted((int(p), int(s), int(n)) for p, s, n in found))


class PushRefusedError(Exception):
    """A push the leader cannot take now (HTTP 429 or 503); `retry_after_s` says when to
    try again."""

    def __init__(self, message: str, *, status: int, retry_after_s: float) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after_s = retry_after_s


class PushOutOfOrderError(Exception):
    """A batch below its writer's position that was never applied (HTTP 409): the writer
    pushed a higher sequence before it, so it can no longer be applied in order. Nothing of
    it was applied; pushing it again cannot help."""


@dataclass(frozen=True)
class PushResult:
    """A push acknowledged: `rows` applied, or 0 and `duplicate` when it was a retry of a
    batch applied before; both flushed."""

    rows: int
    duplicate: bool


@dataclass
class PushRequest:
    """One pushed batch on its way to the pipeline thread; `done` answers it."""

    partition: int
    sequence: int
    rows: pa.RecordBatch  # the pipeline's rows schema, meta columns set (`conform`)
    done: Future[PushResult] = field(default_factory=Future)
    recovered: bool = False
    """Gathered back from copies by a new term: applied even at the buffer's limit (it
    waits there), never refused, and not copied again."""
    nbytes: int = field(init=False)

    def __post_init__(self) -> None:
        self.nbytes = batch_nbytes(self.rows)

    @property
    def first(self) -> int:
        return first_offset(self.sequence)

    @property
    def end(self) -> int:
        """The offset after the batch's last row."""
        return self.first + int(self.rows.num_rows)


@dataclass(frozen=True)
class RecoveredBatch:
    """A pushed batch gathered back from the copies nodes hold (its rows as applied: the
    pipeline's rows schema, meta columns set)."""

    partition: int
    sequence: int
    rows: pa.RecordBatch

    @property
    def end(self) -> int:
        return first_offset(self.sequence) + int(self.rows.num_rows)


@dataclass(frozen=True)
class PushView:
    """A pipeline's pushes as status shows them."""

    rows: int  # applied since the pipeline started reading (retries not counted)
    rows_per_s: float  # over the last few seconds
    writers: int  # with a position in this shard (the checkpoint's and this term's)
    unanswered: int  # batches applied or queued, not yet answered (a copy or a flush)
    copying: int  # batches whose copies to other nodes have not come back
    awaiting_retries: int  # a pending block's batches awaited from their writers


@dataclass(frozen=True)
class _Flushing:
    """An applied push waiting for a checkpoint to reach `end` (its rows let go)."""

    partition: int
    end: int
    done: Future[PushResult]
    result: PushResult


def settle(done: Future[PushResult], result: PushResult | BaseException) -> None:
    """Answer `done` unless its caller gave up (cancelled on a timeout) or it was answered."""
    if done.done():
        return
    if isinstance(result, BaseException):
        done.set_exception(result)
    else:
        done.set_result(result)


def conform(
    table: pa.Table, schema: PipelineSchema, partition: int, sequence: int
) -> pa.RecordBatch:
    """`table` as the pipeline's rows: its declared columns found by name, cast (safely) and
    checked as a decoded Kafka message's are (UUIDs, addresses, enums, nested nulls...), the
    meta columns set (`_partition` the writer's, `_offset` from `sequence`, `_topic`
    PUSH_TOPIC, `_timestamp` now, `_key` null). PushError naming the column, the row and why
    for anything that does not fit: nothing that ClickHouse would refuse gets in."""
    if not 0 <= sequence <= MAX_SEQUENCE:
        raise PushError(f"sequence {sequence} is not within 0..{MAX_SEQUENCE}")
    if table.num_rows > MAX_ROWS:
        raise PushError(f"{table.num_rows} rows in one batch: at most {MAX_ROWS}")
    names = table.column_names
    if len(set(names)) != len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise PushError(f"column {twice[0]!r} is given twice")
    declared = {c.name: c for c in schema.columns}
    unknown = [name for name in names if name not in declared]
    if unknown:
        raise PushError(
            f"column {unknown[0]!r} is not a column of the pipeline "
            f"(its columns: {', '.join(declared)})"
        )
    target = schema.arrow_schema()
    n, columns = table.num_rows, []
    for f in target:
        if f.name in declared:
            columns.append(_column(table, declared[f.name], n))
        else:
            columns.append(_meta(f, n, partition, sequence))
    return pa.RecordBatch.from_arrays(columns, schema=target)


def _column(table: pa.Table, spec: ColumnSpec, n: int) -> pa.Array:
    mapped = spec.mapped
    if spec.name not in table.column_names:
        if spec.is_required:
            raise PushError(f"column {spec.name!r} is required and missing")
        return pa.nulls(n, mapped.arrow)
    given = table.column(spec.name).combine_chunks()
    try:
        text = pc.cast(given, mapped.text, safe=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        row = _first_bad_row(given, mapped.text)
        where = "" if row is None else f", row {row} ({given[row].as_py()!r})"
        raise PushError(
            f"column {spec.name!r}{where}: cannot be read as {mapped.text} "
            f"({given.type} given): {exc}"
        ) from None
    try:
        values = convert_column(pa.chunked_array([text]), mapped, spec.name).combine_chunks()
    except ChunkError as exc:
        raise PushError(str(exc)) from None
    if values.null_count and spec.is_required:
        row = pc.index(pc.is_null(values), True).as_py()
        raise PushError(f"column {spec.name!r}, row {row}: null in a required column")
    return values


def _first_bad_row(values: pa.Array, to: pa.DataType) -> int | None:
    """The first row of `values` that does not cast to `to`: halves the rows until one is
    left (an error path; at most about 20 casts for a million rows)."""
    first, count = 0, len(values)
    if count == 0:
        return None
    while count > 1:
        half = count // 2
        try:
            pc.cast(values.slice(first, half), to, safe=True)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            count = half
            continue
        first, count = first + half, count - half
    return first


def _meta(f: pa.Field, n: int, partition: int, sequence: int) -> pa.Array:
    start = first_offset(sequence)
    match f.name:
        case "_partition":
            return pa.array([partition] * n, f.type)
        case "_offset":
            return pa.array(range(start, start + n), f.type)
        case "_topic":
            return pa.array([PUSH_TOPIC] * n, pa.string()).cast(f.type)
        case "_timestamp":
            return pa.array([int(time.time() * 1000)] * n, pa.int64()).cast(f.type)
        case _:  # _key: a pushed row has none
            return pa.nulls(n, f.type)


class PushDesk:
    """Where request threads leave pushes for the pipeline thread, and wait until they are
    answered; shared by both (its own lock). Queued pushes count against `limit_bytes()`
    (the pipeline's buffer limit) with what the buffer holds (`buffered_bytes()`): past it a
    push gets 429 at once, so neither a full buffer (its pipeline thread waiting for a
    flush) nor a held pipeline thread lets pushes wait out their timeout or pile up."""

    def __init__(
        self, limit_bytes: Callable[[], int], buffered_bytes: Callable[[], int] = lambda: 0
    ) -> None:
        self._limit_bytes = limit_bytes
        self._buffered_bytes = buffered_bytes
        self._lock = threading.Lock()
        self._queue: list[PushRequest] = []
        self._queued_bytes = 0
        self._flushing: list[_Flushing] = []
        self._checkpoint: dict[int, int] = {}
        self._closed: str | None = None
        self._held: str | None = None  # why the pipeline thread takes no push now
        # A pending block's batches that no WAL here has: their retries are taken aside.
        self._awaited: dict[tuple[int, int], int] = {}
        self._retried: dict[tuple[int, int], pa.RecordBatch] = {}
        self.all_retried = threading.Event()
        """Set once every awaited batch was pushed again (see `await_retries`)."""

    def submit(self, request: PushRequest) -> None:
        """Queue `request` for the pipeline thread; answered at once if the desk closed, or
        with 429 if the queued pushes would pass the limit."""
        refusal: Exception | None = None
        key = (request.partition, request.sequence)
        with self._lock:
            limit = self._limit_bytes()
            if self._closed is not None:
                refusal = _unavailable(self._closed)
            elif key in self._awaited:
                refusal = self._retry_of_pending(request, self._awaited[key])
            elif self._held is not None:
                refusal = _full(self._held)
            elif (held := self._buffered_bytes() + self._queued_bytes) + request.nbytes > limit:
                refusal = PushRefusedError(
                    f"{held} bytes buffered or waiting for the pipeline thread: "
                    f"{request.nbytes} more would pass the buffer limit ({limit})",
                    status=429,
                    retry_after_s=1.0,
                )
            else:
                self._queue.append(request)
                self._queued_bytes += request.nbytes
        if refusal is not None:
            settle(request.done, refusal)

    def hold(self, why: str) -> None:
        """The pipeline thread waits for a flush at the buffer's limit and takes no push:
        refuse the queued pushes and new ones with 429 (`why`) until `release`."""
        with self._lock:
            self._held = why
            refused = [r for r in self._queue if not r.recovered]  # recovered ones wait
            self._queue = [r for r in self._queue if r.recovered]
            self._queued_bytes = sum(r.nbytes for r in self._queue)
        for request in refused:
            settle(request.done, _full(why))

    def release(self) -> None:
        """A flush made room: pushes are taken again."""
        with self._lock:
            self._held = None

    def await_retries(self, batches: Iterable[Batch]) -> None:
        """Recovery: the pending block holds `batches` (partition, sequence, rows) that a WAL
        here may lack. Their writers never had them answered, so they push them again:
        from now those retries are taken aside for the re-flush (`retried`), not applied,
        and answered once a checkpoint covers them; `all_retried` is set once all came."""
        with self._lock:
            self._awaited = {(p, seq): rows for p, seq, rows in batches}
            self._retried = {}
            self.all_retried.clear()
            if not self._awaited:
                self.all_retried.set()

    def awaited(self) -> list[Batch]:
        """The awaited batches no retry has brought yet."""
        with self._lock:
            return [
                (p, s, n)
                for (p, s), n in sorted(self._awaited.items())
                if (p, s) not in self._retried
            ]

    def retried(self) -> list[pa.RecordBatch]:
        """The awaited batches' rows, by partition and sequence (once `all_retried`); later
        pushes of them are retries of applied batches again."""
        with self._lock:
            found = [self._retried[key] for key in sorted(self._retried)]
            self._awaited, self._retried = {}, {}
        return found

    def _retry_of_pending(self, request: PushRequest, rows: int) -> Exception | None:
        """Take `request` aside for the re-flush (under the lock); the error to answer it
        with if it is not the batch the pending block holds."""
        if request.rows.num_rows != rows:
            return PushError(
                f"sequence {request.sequence} of this writer was applied with {rows} rows "
                f"before a failover and is being flushed again; this retry has "
                f"{request.rows.num_rows}: push the same batch"
            )
        key = (request.partition, request.sequence)
        self._retried[key] = request.rows
        self._flushing.append(
            _Flushing(request.partition, request.end, request.done, PushResult(rows, False))
        )
        if len(self._retried) == len(self._awaited):
            self.all_retried.set()
        return None

    def durable(self, request: PushRequest) -> None:
        """`request` (applied) is copied as `push_acks` asks: answer it now, before the
        flush."""
        with self._lock:
            found = [w for w in self._flushing if w.done is request.done]
            self._flushing = [w for w in self._flushing if w.done is not request.done]
        for waiting in found:
            settle(waiting.done, waiting.result)

    def recover(self, batches: Iterable[RecoveredBatch]) -> None:
        """A new term gathered `batches` back from copies (before any push is taken): those
        a pending block awaits are taken aside for its re-flush, as retries are; the others
        are queued first, to be applied in order whatever the limit."""
        with self._lock:
            for batch in batches:
                request = PushRequest(batch.partition, batch.sequence, batch.rows, recovered=True)
                key = (batch.partition, batch.sequence)
                if key in self._awaited:
                    self._retry_of_pending(request, self._awaited[key])
                else:
                    self._queue.append(request)

    def committed_end(self, partition: int) -> int:
        """Where the last checkpoint has `partition` (-1: nowhere yet)."""
        with self._lock:
            return self._checkpoint.get(partition, -1)

    def counts(self) -> tuple[int, int]:
        """(pushes not yet answered, awaited batches no retry brought yet)."""
        with self._lock:
            awaited = sum(1 for key in self._awaited if key not in self._retried)
            return len(self._queue) + len(self._flushing), awaited

    def take(self) -> list[PushRequest]:
        """The pipeline thread: every queued push, oldest first (not those whose caller
        gave up: not applied, they are pushed again)."""
        with self._lock:
            taken, self._queue, self._queued_bytes = self._queue, [], 0
        return [r for r in taken if not r.done.cancelled()]

    def applied(self, request: PushRequest, result: PushResult) -> None:
        """`request` is in the WAL and the buffer (or was before): answer it once a
        checkpoint reaches its end."""
        waiting = _Flushing(request.partition, request.end, request.done, result)
        with self._lock:
            if self._checkpoint.get(waiting.partition, -1) < waiting.end:
                self._flushing.append(waiting)
                return
        settle(waiting.done, result)

    def committed(self, checkpoint: Mapping[int, int]) -> None:
        """The flush lane committed `checkpoint` (next offset per partition): answer the
        pushes it covers."""
        with self._lock:
            self._checkpoint = dict(checkpoint)
            covered = [w for w in self._flushing if checkpoint.get(w.partition, -1) >= w.end]
            self._flushing = [w for w in self._flushing if checkpoint.get(w.partition, -1) < w.end]
        for waiting in covered:
            settle(waiting.done, waiting.result)

    def close(self, why: str) -> None:
        """The term ends: every push not yet answered is told to try again (at the next
        leader: retries are applied once)."""
        with self._lock:
            self._closed = why
            waiting = [r.done for r in self._queue] + [w.done for w in self._flushing]
            self._queue, self._queued_bytes, self._flushing = [], 0, []
        for done in waiting:
            settle(done, _unavailable(why))


def _full(why: str) -> PushRefusedError:
    return PushRefusedError(
        f"the buffer is full ({why}) until a flush commits: push again",
        status=429,
        retry_after_s=1.0,
    )


def _unavailable(why: str) -> PushRefusedError:
    return PushRefusedError(
        f"this term of the pipeline ended ({why}): push again", status=503, retry_after_s=1.0
    )
