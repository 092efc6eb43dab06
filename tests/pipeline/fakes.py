"""In-memory parts for `PipelineLeader`: a topic, its consumer, ZooKeeper's fenced state and a
ClickHouse sink that keeps the first insert per task key, as ClickHouse does per token; and
`insert_then_lose_the_term`, the state several pipeline tests start from."""

from __future__ import annotations

import bisect
import functools
import json
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import structlog
from confluent_kafka import TIMESTAMP_CREATE_TIME, Message

from buffer import Catalog, OffsetRange
from chlib.replicas import Replica
from devstack.process import wait_until
from hakafka.config import Config, PipelineConfig, parse_config
from hakafka.consumer import (
    DecodeOptions,
    Decoder,
    OffsetReset,
    PipelineSchema,
    ShardAssignment,
    make_decoder,
)
from hakafka.consumer.partition_consumer import KafkaMetadataError
from hakafka.consumer.schema import dead_letter_arrow_schema
from hakafka.coordination import Checkpoint, FencedError, PendingIntent
from hakafka.coordination.fenced import check_monotonic
from hakafka.faults import CrashPlan
from hakafka.metrics import Metrics
from hakafka.pipeline import PipelineLeader, PipelineParts, PipelineState
from hakafka.pipeline.blockplan import PlannedBlock
from hakafka.pipeline.buffer import PipelineBuffer
from hakafka.pipeline.consume import ConsumeLane
from hakafka.pipeline.context import PipelineContext
from hakafka.pipeline.lane_reader import LaneReader
from hakafka.pipeline.leader import RELEASE_WAIT_S
from hakafka.pipeline.meters import PipelineMeters
from hakafka.pipeline.parts import Flushed, LaneParts
from hakafka.pipeline.push import RecoveredBatch
from hakafka.pipeline.replay import WalIndex
from hakafka.pipeline.state import PipelineStatus, Signals
from hakafka.settings import shard_assignment
from tests.helpers.configs import minimal
from wal import WriteAheadLog

TOPIC = "events"
WAIT_S = 10.0


def wait_for(condition: Callable[[], bool], what: str, timeout: float = WAIT_S) -> None:
    """Poll `condition` every 10 ms (these fakes answer at once); the project's wait_until
    raises naming `what` after `timeout` s."""
    wait_until(condition, timeout=timeout, what=what, interval=0.01)


def pipeline_config(
    on_error: str = "dead_letter", push_acks: int = 1, **buffer: int | float
) -> Config:
    """A one-pipeline config whose buffer flushes as soon as a row is 10 ms old."""
    settings: dict[str, int | float] = {"min_rows": 1, "min_bytes": 1, "min_age": 0.01}
    settings.update(buffer)
    settings.setdefault("limit_bytes", max(1 << 30, int(settings.get("max_bytes", 0))))
    events = {
        "name": "events",
        "topic": TOPIC,
        "table": "events",
        "columns": {"user": "String", "amount": "Int64"},
        "on_error": on_error,
        "push_acks": push_acks,
        "buffer": settings,
        "wal": {"fsync": "off"},
    }
    return parse_config(minimal(pipelines=[events]))


def decoder_for(config: PipelineConfig) -> Decoder:
    schema = PipelineSchema.of(
        [(c.name, c.clickhouse_type) for c in config.columns], config.meta_columns
    )
    return make_decoder(config.format, schema, DecodeOptions(on_error=config.on_error))


class Topic:
    """A topic's partitions: offsets count from 0; `bad` offsets hold malformed JSON; `gap`
    leaves offsets without a message (transaction markers, compacted offsets)."""

    def __init__(self, partitions: int) -> None:
        self.logs: dict[int, list[Message]] = {p: [] for p in range(partitions)}
        self.ends: dict[int, int] = dict.fromkeys(self.logs, 0)  # next offset per partition

    def produce(self, partition: int, count: int, *, bad: Iterable[int] = ()) -> None:
        log, broken = self.logs[partition], set(bad)
        for _ in range(count):
            offset = self.ends[partition]
            self.ends[partition] += 1
            value = (
                b"{not json"
                if offset in broken
                else json.dumps({"user": f"u{partition}", "amount": offset}).encode()
            )
            log.append(
                Message(
                    topic=TOPIC,
                    partition=partition,
                    offset=offset,
                    value=value,
                    key=None,
                    timestamp=(TIMESTAMP_CREATE_TIME, 1_700_000_000_000 + offset),
                )
            )

    def gap(self, partition: int, count: int) -> None:
        """Skip `count` offsets of `partition`: they hold no message a consumer sees."""
        self.ends[partition] += count

    def end_offsets(self) -> dict[int, int]:
        return dict(self.ends)

    def offsets(self, partition: int) -> list[int]:
        """The offsets of `partition` that hold a message."""
        return [offset_of(m) for m in self.logs[partition]]

    def read(self, ranges: Mapping[int, OffsetRange]) -> list[Message]:
        return [
            m for p, r in ranges.items() for m in self.logs[p] if r.first <= offset_of(m) <= r.last
        ]


def offset_of(message: Message) -> int:
    offset = message.offset()
    assert offset is not None
    return offset


class FakeConsumer:
    """Reads a `Topic` from assigned offsets, `batch` per partition and poll, `delay` s a
    poll; records pause/resume calls. `log_starts` are where retention left each partition's
    log: an earlier start moves up to it, as the `earliest` policy does. A topic without
    partitions does not exist; while `unreachable` is set, metadata requests fail with it."""

    def __init__(
        self,
        topic: Topic,
        batch: int = 100,
        delay: float = 0.0,
        log_starts: Mapping[int, int] | None = None,
        assignment: ShardAssignment | None = None,
        *,
        on_reset: Callable[[OffsetReset], None] | None = None,
    ) -> None:
        self.topic = topic
        self.assignment = assignment
        self.on_reset = on_reset
        self.batch = batch
        self.delay = delay
        self.log_starts = dict(log_starts or {})
        self.next: dict[int, int] = {}
        self.paused = False
        self.pauses = 0
        self.closed = False
        self.assigned_from: dict[int, int] = {}
        self.unreachable: str | None = None
        self.unfetched_polls = 0
        """Polls that come back empty with the lag unknown, as librdkafka's do before its
        first fetch answers."""

    def topic_partitions(self) -> list[int]:
        if self.unreachable is not None:
            raise KafkaMetadataError(f"topic {TOPIC}: metadata request failed: {self.unreachable}")
        return sorted(self.topic.logs)

    def owned_partitions(self) -> list[int]:
        partitions = self.topic_partitions()
        return partitions if self.assignment is None else self.assignment.select(partitions)

    def assign(self, start_offsets: Mapping[int, int]) -> list[int]:
        self.next = {
            p: max(start_offsets.get(p, 0), self.log_starts.get(p, 0))
            for p in self.owned_partitions()
        }
        self.assigned_from = dict(self.next)
        for p, offset in start_offsets.items():
            if self.on_reset is not None and offset < self.next.get(p, offset):
                self.on_reset(OffsetReset(TOPIC, p, offset, self.next[p], self.topic.ends[p]))
        return sorted(self.next)

    def consume(self, num_messages: int, timeout: float) -> Sequence[Message]:
        """Up to `batch` messages per partition; the position then passes the offsets
        without a message up to the next message, or up to the end, as librdkafka's does."""
        time.sleep(self.delay)
        if self.unfetched_polls > 0:
            self.unfetched_polls -= 1
            time.sleep(min(timeout, 0.01))
            return []
        if self.paused:
            time.sleep(min(timeout, 0.01))
            return []
        out: list[Message] = []
        for p in list(self.next):  # the assigned partitions (a topic may grow meanwhile)
            log = self.topic.logs[p]
            at = bisect.bisect_left(log, self.next[p], key=offset_of)
            take = log[at : at + min(self.batch, num_messages - len(out))]
            out.extend(take)
            rest = at + len(take)
            end = offset_of(log[rest]) if rest < len(log) else self.topic.ends[p]
            self.next[p] = max(self.next[p], end)
        if not out:
            time.sleep(min(timeout, 0.01))
        return out

    def refresh_partitions(self) -> list[int]:
        """Partitions that appeared since `assign` (a topic created later), from 0."""
        new = sorted(set(self.owned_partitions()) - set(self.next))
        self.next.update(dict.fromkeys(new, 0))
        return new

    def pause(self, partitions: Iterable[int] | None = None) -> None:
        self.paused = True
        self.pauses += 1

    def resume(self, partitions: Iterable[int] | None = None) -> None:
        self.paused = False

    def position(self) -> dict[int, int]:
        return dict(self.next)

    def lag(self) -> dict[int, int]:
        if self.unfetched_polls > 0:
            return {}
        return {p: self.topic.ends[p] - o for p, o in self.next.items()}

    def close(self) -> None:
        self.closed = True


def filled_topic(partitions: int, count: int) -> Topic:
    """A topic of `partitions` partitions holding `count` good messages each."""
    topic = Topic(partitions)
    for partition in range(partitions):
        topic.produce(partition, count)
    return topic


@dataclass(frozen=True)
class LaneTopic:
    """Each lane process's consumer of its part of `filled_topic(partitions, count)` (made
    again in the process: confluent-kafka's Messages do not pickle): the last lane's comes
    `late` seconds late, so the others read meanwhile; the first lane's polls take `slow`
    seconds each; retention left each partition's log at `log_start` (an earlier start
    resets to it, through `on_reset`)."""

    partitions: int
    count: int
    late: float = 0.0
    slow: float = 0.0
    log_start: int = 0

    def __call__(
        self, assignment: ShardAssignment, *, on_reset: Callable[[OffsetReset], None]
    ) -> FakeConsumer:
        if assignment.lane == assignment.lanes - 1:
            time.sleep(self.late)
        return FakeConsumer(
            filled_topic(self.partitions, self.count),
            delay=self.slow if assignment.lane == 0 else 0.0,
            log_starts=dict.fromkeys(range(self.partitions), self.log_start),
            assignment=assignment,
            on_reset=on_reset,
        )


def lane_parts(config: Config, topic: LaneTopic, lanes: int) -> LaneParts:
    """`lanes` lane processes reading `topic` for `config`'s first pipeline."""
    return LaneParts(
        consumer=topic,
        decoder=functools.partial(decoder_for, config.pipelines[0]),
        count=lanes,
    )


class FakeFenced:
    """ZooKeeper's checkpoint and pending intent of one term; `fenced` ends the term."""

    def __init__(self, epoch: int = 1) -> None:
        self.epoch = epoch
        self.checkpoint: Checkpoint = {}
        self.pending: PendingIntent | None = None
        self.others: dict[int, Checkpoint] = {}  # the checkpoints of other shards
        self.writers: dict[str, int] = {}  # push writer -> its number
        self.fenced = False
        self.refuse_writes = False  # as while the ZooKeeper connection is suspended
        self.commits = 0
        self.committed_at: float | None = None  # Unix time of the last checkpoint write
        self._lock = threading.Lock()

    def next_term(self) -> FakeFenced:
        """The same state seen by the next leader."""
        following = FakeFenced(self.epoch + 1)
        following.checkpoint, following.pending = self.checkpoint, self.pending
        following.committed_at = self.committed_at
        following.others = self.others
        following.writers = self.writers
        return following

    def _check(self, write: bool = False) -> None:
        if self.fenced or (write and self.refuse_writes):
            raise FencedError(f"epoch {self.epoch} is over")

    def read_checkpoint(self, pipeline: str) -> Checkpoint:
        self._check()
        return {t: dict(o) for t, o in self.checkpoint.items()}

    def checkpoint_age(self, pipeline: str) -> float | None:
        self._check()
        return None if self.committed_at is None else max(0.0, time.time() - self.committed_at)

    def read_other_checkpoints(self, pipeline: str) -> dict[int, Checkpoint]:
        self._check()
        return {s: {t: dict(o) for t, o in cp.items()} for s, cp in self.others.items()}

    def read_pending(self, pipeline: str) -> PendingIntent | None:
        self._check()
        return self.pending

    def write_pending(self, pipeline: str, intent: PendingIntent) -> None:
        with self._lock:
            self._check(write=True)
            # Through the znode's encoding, as the next leader reads it.
            self.pending = PendingIntent.decode("pending", intent.encode())

    def commit_checkpoint(self, pipeline: str, offsets: Checkpoint) -> Checkpoint:
        with self._lock:
            self._check(write=True)
            check_monotonic(0, pipeline, self.checkpoint, offsets)
            for topic, parts in offsets.items():
                self.checkpoint.setdefault(topic, {}).update(parts)
            self.pending = None
            self.commits += 1
            self.committed_at = time.time()
            return {t: dict(o) for t, o in self.checkpoint.items()}

    def writer_number(self, pipeline: str, writer: str) -> int:
        with self._lock:
            self._check(write=True)
            return self.writers.setdefault(writer, len(self.writers))


@dataclass
class FakeSink:
    """ClickHouse's side: keeps the first insert per task key (`rows`, `dead`: key -> rows),
    as it keeps the first per deduplication token. `gate` (when cleared) holds flushes;
    `failures` fail the next ones; `die_after_tasks` = n makes the next flush insert n tasks
    and then fail (an attempt killed between tasks)."""

    rows: dict[str, pa.Table] = field(default_factory=dict)
    dead: dict[str, pa.Table] = field(default_factory=dict)
    attempts: int = 0
    failures: int = 0
    die_after_tasks: int | None = None
    table_failures: int = 0
    gate: threading.Event = field(default_factory=threading.Event)
    entered: threading.Event = field(default_factory=threading.Event)
    tables_ensured: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.gate.set()

    def fail(self, times: int) -> None:
        """Fail the next `times` flushes (0: none)."""
        with self.lock:
            self.failures = times

    def ensure_tables(self, replicas: tuple[Replica, ...]) -> None:
        with self.lock:
            if self.table_failures:
                self.table_failures -= 1
                raise ConnectionError("ClickHouse is away (tables)")
            self.tables_ensured += 1

    def flush(self, block: PlannedBlock, replicas: tuple[Replica, ...]) -> Flushed:
        self.attempts += 1
        self.entered.set()
        if not self.gate.wait(WAIT_S):
            raise TimeoutError("the test never opened the sink's gate")
        with self.lock:
            failing, self.failures = self.failures > 0, max(0, self.failures - 1)
            budget, self.die_after_tasks = self.die_after_tasks, None
        if failing:
            raise ConnectionError("ClickHouse is away")
        sealed = block.block
        for half, tasks, kept in (
            (sealed.rows, block.rows, self.rows),
            (sealed.dead_letters, block.dead, self.dead),
        ):
            for task in tasks:
                if half is None or not task.rows:
                    continue  # the real flush sends no task without rows
                if budget is not None and budget <= 0:
                    raise ConnectionError("the flush was killed between tasks")
                kept.setdefault(task.key, half.table.slice(task.start, task.rows))
                budget = None if budget is None else budget - 1
        return Flushed(sealed.row_count, sealed.dead_count, "n1")

    def offsets(self) -> list[tuple[int, int]]:
        """Every (`_partition`, `_offset`) the table holds, with repeats."""
        return _offsets(self.rows.values())

    def dead_offsets(self) -> list[tuple[int, int]]:
        return _offsets(self.dead.values())


def _offsets(tables: Iterable[pa.Table]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for t in tables:
        partitions, offsets = t.column("_partition"), t.column("_offset")
        out.extend(zip(partitions.to_pylist(), offsets.to_pylist(), strict=True))
    return sorted(out)


@dataclass
class Refetches:
    """Re-reads ranges from the fake topic, counting the calls."""

    topic: Topic
    calls: int = 0

    def __call__(
        self, ranges: Mapping[int, OffsetRange], decoder: Decoder, step: Callable[[], None]
    ) -> tuple[pa.Table, pa.Table | None]:
        step()
        self.calls += 1
        decoded = decoder.decode(self.topic.read(ranges))
        dead = decoded.dead_letters
        return pa.Table.from_batches([decoded.rows]), (
            pa.Table.from_batches([dead]) if dead is not None else None
        )


@dataclass
class FakeMirror:
    """Records the checkpoints a pipeline mirrors (to a Kafka consumer group in the daemon)."""

    published: list[dict[int, int]] = field(default_factory=list)
    closed: bool = False

    def publish(self, offsets: Mapping[int, int]) -> None:
        self.published.append(dict(offsets))

    def close(self) -> None:
        self.closed = True


@dataclass
class FakeCopies:
    """The shard's other nodes' copies of pushed batches, in memory, by (partition,
    sequence); while `stores` is False no copy is taken (replicate says so)."""

    held: dict[tuple[int, int], RecoveredBatch] = field(default_factory=dict)
    stores: bool = True

    def replicate(
        self, partition: int, sequence: int, rows: pa.RecordBatch, acks: int, trim: int
    ) -> Future[bool]:
        done: Future[bool] = Future()
        if self.stores:
            self.held[(partition, sequence)] = RecoveredBatch(partition, sequence, rows)
        done.set_result(self.stores)
        return done

    def recover(self) -> list[RecoveredBatch]:
        return [self.held[key] for key in sorted(self.held)]


@dataclass
class Harness:
    """One leader's parts; `leader()` builds a leader of the current term over them."""

    tmp_path: Path
    config: Config
    topic: Topic
    sink: FakeSink = field(default_factory=FakeSink)
    fenced: FakeFenced = field(default_factory=FakeFenced)
    catalog: Catalog = field(default_factory=Catalog)
    crash: CrashPlan = field(default_factory=lambda: CrashPlan(None))
    consumers: list[FakeConsumer] = field(default_factory=list)
    mirror: FakeMirror = field(default_factory=FakeMirror)
    refetch: Refetches | None = None
    wal_dir_name: str = "wal"
    shard: int = 0
    registries: list[Any] = field(default_factory=list)
    """The metrics registry of each leader built, in order."""
    kafka_unreachable: str | None = None
    """The metadata error each new consumer starts with (None: Kafka answers)."""
    unfetched_polls: int = 0
    """How many polls of each new consumer come back empty before its first fetch."""
    lanes: LaneParts | None = None
    """Lane processes the leaders read with (None: one lane, with `consumers`)."""
    copies: FakeCopies | None = None
    """Where pushed batches are copied (None: no copies part)."""
    release_wait_s: float = RELEASE_WAIT_S
    """How long a leader waits for a previous instance to let go of the buffer's names."""

    def __post_init__(self) -> None:
        self.refetch = Refetches(self.topic)

    @property
    def pipeline(self) -> PipelineConfig:
        return self.config.pipelines[0]

    def _consumer(self) -> FakeConsumer:
        consumer = FakeConsumer(self.topic)
        consumer.unreachable = self.kafka_unreachable
        consumer.unfetched_polls = self.unfetched_polls
        self.consumers.append(consumer)
        return consumer

    def _registry(self) -> Any:
        self.registries.append(_registry())
        return self.registries[-1]

    def leader(self, *, drain: bool = False, decoder: Decoder | None = None) -> PipelineLeader:
        """A leader of the current term; `decoder` replaces the pipeline's own."""
        assert self.refetch is not None
        return PipelineLeader(
            config=self.pipeline,
            shard=self.shard,
            decoder=decoder if decoder is not None else decoder_for(self.pipeline),
            parts=PipelineParts(
                consumer=self._consumer,
                # The directory as it is now: the leader opens it later, on its own thread.
                open_wal=functools.partial(
                    WriteAheadLog.open, self.tmp_path / self.wal_dir_name, fsync="off"
                ),
                refetch=self.refetch,
                sink=self.sink,
                fenced=self.fenced,
                replicas=lambda: (),
                mirror=lambda: self.mirror,
                lanes=self.lanes,
                push_copies=self.copies,
            ),
            assignment=shard_assignment(self.config, self.pipeline, self.shard),
            rows_per_task=self.config.spark.rows_per_task,
            catalog=self.catalog,
            metrics=Metrics.create(registry=self._registry()),
            crash=self.crash,
            drain=drain,
            release_wait_s=self.release_wait_s,
        )

    def consume_lane(self) -> ConsumeLane:
        """A consume lane of this pipeline on its own, with a fresh buffer and signals."""
        pipeline = self.pipeline
        decoder = decoder_for(pipeline)
        context = PipelineContext(
            config=pipeline,
            buffer=PipelineBuffer(
                pipeline.name,
                decoder.schema.arrow_schema(),
                dead_letter_arrow_schema(),
                pipeline.buffer.limit_bytes,
            ),
            index=WalIndex(),
            signals=Signals(),
            status=PipelineStatus(),
            meters=PipelineMeters(
                Metrics.create(registry=_registry()), pipeline.name, 0, pipeline.on_error
            ),
            crash=self.crash,
            log=structlog.get_logger("tests"),
        )
        return ConsumeLane(context)

    def lane_reader(self) -> LaneReader:
        """A lane reader of this pipeline on its own, with fresh signals and status."""
        pipeline = self.pipeline
        return LaneReader(
            pipeline.name,
            pipeline.topic,
            decoder_for(pipeline),
            Signals(),
            PipelineStatus(),
            structlog.get_logger("tests"),
        )


def one_partition(
    tmp_path: Path, count: int, bad: Iterable[int] = (), **config: Any
) -> tuple[Topic, Harness]:
    """A one-partition topic holding `count` messages (`bad` ones malformed) and a harness
    over it with `pipeline_config(**config)`."""
    topic = Topic(partitions=1)
    topic.produce(0, count, bad=bad)
    return topic, Harness(tmp_path, pipeline_config(**config), topic)


def decoder_rows(h: Harness) -> pa.RecordBatch:
    """One decoded row of `h`'s pipeline."""
    topic = Topic(partitions=1)
    topic.produce(0, 1)
    return decoder_for(h.pipeline).decode(topic.logs[0]).rows


def _registry() -> Any:
    from prometheus_client import CollectorRegistry

    return CollectorRegistry()


def start(h: Harness, leaders: list[PipelineLeader], *, drain: bool = False) -> PipelineLeader:
    """Start a leader of `h`'s current term (in drain mode with `drain`); `leaders` (the
    fixture) stops it after the test."""
    leader = h.leader(drain=drain)
    leaders.append(leader)
    leader.start()
    return leader


def insert_then_lose_the_term(
    h: Harness,
    leaders: list[PipelineLeader],
    while_in_flight: Callable[[PipelineLeader], object] = lambda _leader: None,
) -> PendingIntent:
    """A leader inserts its first block and its term ends before the checkpoint (killed or
    fenced); returns the intent it left, with `h` switched to the next term.
    `while_in_flight(leader)` runs while the insert is held."""
    h.sink.gate.clear()
    first = start(h, leaders)
    wait_for(h.sink.entered.is_set, "the first flush")
    while_in_flight(first)
    h.fenced.fenced = True  # the term ends while the insert is in flight
    h.sink.gate.set()
    wait_for(lambda: bool(h.sink.rows), "the insert to land")
    first.stop(5.0)  # what the shard does when the term is lost
    assert not first.running
    assert first.status.state is PipelineState.STOPPED
    assert h.fenced.commits == 0 and h.fenced.pending is not None
    pending = h.fenced.pending
    h.fenced = h.fenced.next_term()
    return pending
