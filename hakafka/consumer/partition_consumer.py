"""`PartitionConsumer`: one topic's shard partitions over confluent-kafka, assign-only.

Never subscribes (no group rebalances) and never commits offsets to Kafka: the daemon's
checkpoint in ZooKeeper is the only source of start offsets. `auto.offset.reset` is forced to
`error`, so an out-of-range offset always reaches the explicit `out_of_range` policy; reads
are `read_committed`, so aborted transactions are never ingested.

Positions are the next offset to read, as librdkafka advances them: past transaction markers
and offsets a compacted or trimmed log no longer has, so consecutive batches are contiguous
in positions even where offsets are missing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import structlog
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from hakafka.consumer.assignment import ShardAssignment
from hakafka.consumer.errors import ConsumerError, KafkaConsumeError, OffsetOutOfRangeError
from hakafka.logs import library_logger


class OutOfRange(StrEnum):
    """What to do with a start offset outside the partition's log (Kafka `out_of_range`).

    FAIL: raise `OffsetOutOfRangeError` (ops decide). EARLIEST: read from the log start and
    report the offsets retention removed (`OffsetReset`).
    """

    FAIL = "fail"
    EARLIEST = "earliest"


log = structlog.get_logger("hakafka.consumer.partition_consumer")

CLIENT_LOG = library_logger("librdkafka", "librdkafka.log")
"""Every client's `logger`: librdkafka's log lines become debug events, handed over on the
thread that polls the client (`consume`, `poll`), never written to stderr by its threads."""

_SECRET_MARKERS = ("password", "secret", "sasl.jaas", "ssl.key", "token")
# Settings the consumer owns; a passthrough value for them would break exactly-once.
_FORCED: dict[str, Any] = {
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    "auto.offset.reset": "error",
    "enable.partition.eof": False,
    "allow.auto.create.topics": False,
    "isolation.level": "read_committed",
}
# Throughput defaults for batches of ~10k messages of ~200 bytes; any can be overridden.
DEFAULT_TUNING: dict[str, Any] = {
    "fetch.min.bytes": 1,
    "fetch.wait.max.ms": 100,
    "fetch.max.bytes": 64 << 20,
    "max.partition.fetch.bytes": 8 << 20,
    "fetch.message.max.bytes": 8 << 20,
    "queued.min.messages": 200_000,
    "queued.max.messages.kbytes": 256 << 10,
    "socket.receive.buffer.bytes": 4 << 20,
}
# What a passthrough setting may not name (config check refuses them before any start).
MANAGED_SETTINGS = frozenset({*_FORCED, "group.id", "bootstrap.servers", "logger", "error_cb"})
_UNKNOWN_TOPIC = KafkaError.UNKNOWN_TOPIC_OR_PART
_OUT_OF_RANGE_CODES = frozenset({KafkaError.OFFSET_OUT_OF_RANGE, KafkaError._AUTO_OFFSET_RESET})
_IGNORED_CODES = frozenset({KafkaError._PARTITION_EOF})


class KafkaMetadataError(ConsumerError):
    """Topic metadata or a partition's log start could not be read (a broker hiccup: retry)."""


def redact_settings(settings: Mapping[str, Any]) -> dict[str, Any]:
    """`settings` with the values of secret-looking keys replaced by `***` (for logs, repr),
    and without the callables hakafka hands librdkafka (`logger`, `error_cb`: the latter's
    repr would be its consumer's, a recursion)."""
    return {
        key: "***" if any(marker in key.lower() for marker in _SECRET_MARKERS) else value
        for key, value in settings.items()
        if key not in ("logger", "error_cb")
    }


@dataclass(frozen=True)
class OffsetReset:
    """An out-of-range offset handled by the `earliest` policy.

    `skipped` counts offsets that will never be read (`reset_to - requested` when retention
    ran past the checkpoint, 0 when the requested offset lay beyond the log's end).
    """

    topic: str
    partition: int
    requested: int
    reset_to: int
    high_watermark: int

    @property
    def skipped(self) -> int:
        return max(0, self.reset_to - self.requested)


class PartitionConsumer:
    """Reads the assigned partitions of one topic from explicit start offsets.

    `partitions` is a fixed list, or a `ShardAssignment` whose partitions are resolved from
    topic metadata (and refreshed by `refresh_partitions`). `settings` pass through to
    librdkafka (security.protocol, SASL, TLS, tuning) and are never logged unredacted.
    `group_id` only namespaces the client; offsets are never committed to Kafka.
    `on_reset` is called for every offset reset under the `earliest` policy (metrics).
    """

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        partitions: Iterable[int] | ShardAssignment,
        *,
        settings: Mapping[str, Any] | None = None,
        out_of_range: OutOfRange = OutOfRange.FAIL,
        group_id: str = "hakafka",
        on_reset: Callable[[OffsetReset], None] | None = None,
        metadata_timeout: float = 10.0,
    ) -> None:
        try:  # an untyped caller may pass the plain string
            policy = OutOfRange(out_of_range)
        except ValueError:
            raise ValueError(
                f"out_of_range must be 'earliest' or 'fail', got {out_of_range!r}"
            ) from None
        settings = dict(settings or {})
        clash = sorted(key for key in settings if key in MANAGED_SETTINGS)
        if clash:
            raise ValueError(
                f"librdkafka settings {clash} are managed by hakafka and cannot be overridden"
            )
        self.topic = topic
        self.out_of_range = policy
        self._spec = partitions if isinstance(partitions, ShardAssignment) else None
        self._fixed = None if self._spec is not None else sorted(set(partitions))  # type: ignore[arg-type]
        self._on_reset = on_reset
        self._timeout = metadata_timeout
        lane = f"-lane{self._spec.lane}" if self._spec is not None and self._spec.lanes > 1 else ""
        self._config: dict[str, Any] = {
            **DEFAULT_TUNING,
            # One per lane: a broker may keep per-client state (tansu's fetches did).
            "client.id": f"{group_id}-{topic}{lane}",
            **settings,
            **_FORCED,
            "bootstrap.servers": bootstrap,
            "group.id": group_id,
            "logger": CLIENT_LOG,
            "error_cb": self._client_error,
        }
        self._consumer = Consumer(self._config)
        self._positions: dict[int, int] = {}
        # Start offsets from the caller, kept until (and after) their partition shows up.
        self._starts: dict[int, int] = {}
        self._paused: set[int] = set()
        # Partitions whose start offset was not yet checked against the high watermark.
        self._unverified: set[int] = set()
        self._closed = False

    def __repr__(self) -> str:
        return f"PartitionConsumer(topic={self.topic!r}, config={redact_settings(self._config)})"

    # -- assignment ------------------------------------------------------------------

    def topic_partitions(self) -> list[int]:
        """All partitions of the topic per fresh metadata.

        [] if the topic does not exist and no start offset is known for it (it may be created
        later). KafkaMetadataError if the request fails, the topic or a partition reports an
        error, or a topic whose start offsets are known is missing: never "no partitions".
        """
        try:
            metadata = self._consumer.list_topics(self.topic, timeout=self._timeout)
        except KafkaException as exc:
            raise KafkaMetadataError(
                f"topic {self.topic}: metadata request failed: {exc}"
            ) from None
        topic = metadata.topics.get(self.topic)
        error = None if topic is None else topic.error
        if topic is None or (error is not None and error.code() == _UNKNOWN_TOPIC):
            if self._starts:
                raise KafkaMetadataError(
                    f"topic {self.topic} is missing from metadata, yet start offsets are "
                    f"known for partitions {sorted(self._starts)}"
                )
            return []
        if error is not None:
            raise KafkaMetadataError(f"topic {self.topic}: metadata error {error.str()}")
        broken = {p: m.error.str() for p, m in topic.partitions.items() if m.error is not None}
        # Only errors of partitions this consumer reads hold it up (another shard's partition
        # without a leader must not stop this one).
        mine = {p: e for p, e in broken.items() if p in self._starts or self._owns(p)}
        if mine:
            raise KafkaMetadataError(f"topic {self.topic}: partition metadata errors {mine}")
        return sorted(topic.partitions)

    def _owns(self, partition: int) -> bool:
        if self._fixed is not None:
            return partition in self._fixed
        assert self._spec is not None
        return bool(self._spec.select([partition]))

    def owned_partitions(self) -> list[int]:
        """The partitions this consumer should read, per the spec and current metadata."""
        if self._fixed is not None:
            return list(self._fixed)
        assert self._spec is not None
        return self._spec.select(self.topic_partitions())

    def assign(self, start_offsets: Mapping[int, int]) -> list[int]:
        """Start reading every owned partition; returns the assigned partitions.

        Every start offset is kept: a partition metadata does not show yet starts at its
        known offset when it appears (`refresh_partitions`). A partition without one starts
        at its first available offset. A start offset below the log start follows the
        `out_of_range` policy right here; one beyond the log end is detected after the
        first fetch (see `consume`). KafkaMetadataError (nothing assigned, the known offsets
        kept) if metadata cannot be read: call `assign` again.
        """
        if self._positions:
            raise RuntimeError(f"{self!r} is already assigned; close it and create a new one")
        self._starts = dict(start_offsets)
        owned = self.owned_partitions()
        self._add(owned)
        return owned

    def refresh_partitions(self) -> list[int]:
        """Assign owned partitions that appeared since `assign`, from their known start
        offset, else their first offset.

        Returns the newly assigned partitions, sorted; call it periodically.
        KafkaMetadataError (nothing changed) if metadata cannot be read.
        """
        new = sorted(set(self.owned_partitions()) - set(self._positions))
        if new:
            self._add(new)
            log.info(
                "consumer.partitions_added",
                topic=self.topic,
                partitions=new,
                start_offsets={p: self._positions[p] for p in new},
            )
        return new

    def _add(self, partitions: Iterable[int]) -> None:
        # Every start first: a failed watermark query must leave nothing half assigned.
        starts = {}
        for partition in partitions:
            low = self._low_watermark(partition)
            start = self._starts.get(partition, low)
            if start < low:
                start = self._out_of_range(partition, start, low=low, high=None)
            starts[partition] = start
        if starts:
            self._positions.update(starts)
            self._unverified.update(starts)
            self._consumer.incremental_assign(
                [TopicPartition(self.topic, p, o) for p, o in starts.items()]
            )

    def _low_watermark(self, partition: int) -> int:
        # ListOffsets EARLIEST is reliable (LATEST is not, on tansu): query only the low end.
        try:
            low, _ = self._consumer.get_watermark_offsets(
                TopicPartition(self.topic, partition), timeout=self._timeout, cached=False
            )
        except KafkaException as exc:
            raise KafkaMetadataError(
                f"{self.topic}[{partition}]: log start offset unavailable: {exc}"
            ) from None
        return int(low)

    # -- consumption -----------------------------------------------------------------

    def consume(self, num_messages: int = 10_000, timeout: float = 1.0) -> list[Message]:
        """Up to `num_messages` data messages, waiting at most `timeout` seconds.

        Error events are handled here: partition EOF is ignored, an out-of-range offset
        follows the policy (`OffsetOutOfRangeError` under `fail`), a fatal error raises
        `KafkaConsumeError`, other errors are logged (librdkafka retries them).
        """
        messages = self._consumer.consume(num_messages, timeout)
        if not messages:
            self._follow_positions()
            self._verify_positions()
            return []
        errors = [m for m in messages if m.error() is not None]
        if errors:
            for event in errors:
                self._handle_error(event)
            messages = [m for m in messages if m.error() is None]
        # Last offset per partition: a dict comprehension keeps the last one seen.
        last: dict[int, int] = {m.partition(): m.offset() for m in messages}  # type: ignore[misc]
        for partition, offset in last.items():
            self._positions[partition] = offset + 1
        self._follow_positions()
        self._unverified.difference_update(last)
        if self._unverified:
            self._verify_positions()
        return messages

    def _follow_positions(self) -> None:
        """Move each tracked position up to librdkafka's, which also passes transaction
        markers and offsets missing from the log (its "none yet", -1001, is below any)."""
        if not self._positions:
            return
        tps = [TopicPartition(self.topic, p) for p in self._positions]
        for tp in self._consumer.position(tps):
            self._positions[tp.partition] = max(self._positions[tp.partition], tp.offset)

    def _verify_positions(self) -> None:
        """Apply the policy to partitions whose position lies beyond the fetched high
        watermark (brokers like tansu return no error for such fetches)."""
        for partition in sorted(self._unverified):
            high = self._cached_watermarks(partition)[1]
            if high < 0:
                continue  # no fetch response yet
            self._unverified.discard(partition)
            position = self._positions[partition]
            if position > high:
                self._reassign(
                    partition, self._out_of_range(partition, position, low=None, high=high)
                )

    def _client_error(self, error: KafkaError) -> None:
        """librdkafka's client-wide errors (served by `consume`). Its log repeats each failed
        connection at debug; this says once per outage that no broker can be reached."""
        if error.code() == KafkaError._ALL_BROKERS_DOWN:
            log.warning("consumer.brokers_down", topic=self.topic, error=error.str())

    def _handle_error(self, event: Message) -> None:
        error = event.error()
        if error is None:
            return
        code = error.code()
        if code in _IGNORED_CODES:
            return
        partition = event.partition()
        if code in _OUT_OF_RANGE_CODES and partition is not None and partition >= 0:
            requested = self._positions.get(partition, event.offset() or -1)
            self._reassign(partition, self._out_of_range(partition, requested, low=None, high=None))
            return
        if error.fatal():
            raise KafkaConsumeError(
                f"fatal Kafka error on {self.topic}[{partition}]: {error.str()} ({error.name()})"
            )
        log.warning(
            "consumer.kafka_error", topic=self.topic, partition=partition, error=error.str()
        )

    def _out_of_range(
        self, partition: int, requested: int, *, low: int | None, high: int | None
    ) -> int:
        """Apply the policy to `requested`; returns the offset to read from (`earliest`)."""
        if low is None:
            low = self._low_watermark(partition)
        if high is None:
            high = self._cached_watermarks(partition)[1]
        if self.out_of_range is OutOfRange.FAIL:
            raise OffsetOutOfRangeError(self.topic, partition, requested, low, max(high, low))
        reset = OffsetReset(self.topic, partition, requested, low, high)
        log.error(
            "consumer.offset_out_of_range",
            topic=self.topic,
            partition=partition,
            requested=requested,
            reset_to=low,
            high_watermark=high,
            skipped_offsets=reset.skipped,
            policy="earliest",
        )
        if self._on_reset is not None:
            self._on_reset(reset)
        return low

    def _reassign(self, partition: int, offset: int) -> None:
        tp = TopicPartition(self.topic, partition, offset)
        self._consumer.incremental_unassign([TopicPartition(self.topic, partition)])
        self._consumer.incremental_assign([tp])
        if partition in self._paused:
            self._consumer.pause([tp])
        self._positions[partition] = offset

    # -- flow control and progress ---------------------------------------------------

    def _tps(self, partitions: Iterable[int] | None) -> list[TopicPartition]:
        chosen = self._positions.keys() if partitions is None else partitions
        unknown = sorted(set(chosen) - set(self._positions))
        if unknown:
            raise ValueError(f"partitions {unknown} of {self.topic} are not assigned")
        return [TopicPartition(self.topic, p) for p in sorted(chosen)]

    def pause(self, partitions: Iterable[int] | None = None) -> None:
        """Stop fetching the given partitions (all if None) until `resume`."""
        tps = self._tps(partitions)
        self._consumer.pause(tps)
        self._paused.update(tp.partition for tp in tps)

    def resume(self, partitions: Iterable[int] | None = None) -> None:
        """Fetch the given partitions (all if None) again."""
        tps = self._tps(partitions)
        self._consumer.resume(tps)
        self._paused.difference_update(tp.partition for tp in tps)

    def paused(self) -> set[int]:
        return set(self._paused)

    def assigned(self) -> list[int]:
        return sorted(self._positions)

    def position(self) -> dict[int, int]:
        """Next offset to read per assigned partition: past the delivered messages, and past
        markers and missing offsets once librdkafka has fetched beyond them."""
        return dict(self._positions)

    def _cached_watermarks(self, partition: int) -> tuple[int, int]:
        low, high = self._consumer.get_watermark_offsets(
            TopicPartition(self.topic, partition), cached=True
        )
        return int(low), int(high)

    def high_watermarks(self) -> dict[int, int]:
        """High watermark per partition from the latest fetch response (absent: none yet)."""
        out = {}
        for partition in self._positions:
            high = self._cached_watermarks(partition)[1]
            if high >= 0:
                out[partition] = high
        return out

    def lag(self) -> dict[int, int]:
        """Messages behind the fetched high watermark per partition (absent: unknown yet)."""
        return {p: max(0, high - self._positions[p]) for p, high in self.high_watermarks().items()}

    def close(self) -> None:
        """Leave the partitions and free the client; idempotent."""
        if not self._closed:
            self._closed = True
            self._consumer.close()
