"""Known records for tests and the demo: produce them, then check ClickHouse has each once."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

# The columns of the sample events, as a pipeline declares them.
EVENT_COLUMNS = {"id": "Int64", "kind": "LowCardinality(String)", "amount": "Nullable(Float64)"}
KINDS = ("click", "view", "buy")


@dataclass
class Produced:
    """The exact (partition, offset) of every good and every malformed record produced."""

    good: set[tuple[int, int]] = field(default_factory=set)
    bad: set[tuple[int, int]] = field(default_factory=set)

    def __ior__(self, other: Produced) -> Produced:
        self.good |= other.good
        self.bad |= other.bad
        return self


@dataclass(frozen=True)
class Tally:
    """How a ClickHouse table's (_partition, _offset) pairs compare with what was produced."""

    rows: int
    duplicates: int
    missing: int
    unexpected: int

    @property
    def exactly_once(self) -> bool:
        return self.duplicates == 0 and self.missing == 0 and self.unexpected == 0


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
        future.result(timeout=15)


def event(i: int) -> bytes:
    return json.dumps({"id": i, "kind": KINDS[i % 3], "amount": i / 2}).encode()


def produce(
    bootstrap: str,
    topic: str,
    count: int,
    *,
    partitions: int,
    start: int = 0,
    bad_every: int = 0,
    linger_ms: int = 20,
) -> Produced:
    """Records `start..start+count-1` round-robin over `partitions`; every `bad_every`-th one
    is malformed JSON. Offsets come from the broker's delivery reports. A `linger_ms` longer
    than producing `count` records takes sends them as one batch per partition."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": linger_ms, "acks": "all"})
    result = Produced()

    def delivered(err: Any, msg: Any) -> None:
        if err is not None:
            raise RuntimeError(f"delivery failed: {err}")
        key = (msg.partition(), msg.offset())
        (result.bad if msg.value().startswith(b"{bad") else result.good).add(key)

    for i in range(start, start + count):
        bad = bad_every > 0 and i % bad_every == bad_every - 1
        value = b"{bad json %d" % i if bad else event(i)
        while True:
            try:
                producer.produce(
                    topic, value=value, partition=i % partitions, on_delivery=delivered
                )
                break
            except BufferError:
                producer.poll(0.1)
        if i % 5000 == 0:
            producer.poll(0)
    if producer.flush(60) != 0:
        raise RuntimeError("records still undelivered after 60 s")
    return result


def tally(client: Any, table: str, expected: set[tuple[int, int]]) -> Tally:
    """Compare `table`'s (_partition, _offset) with `expected`."""
    got = [
        (int(p), int(o))
        for p, o in client.query(f"SELECT _partition, _offset FROM {table}").result_rows
    ]
    distinct = set(got)
    return Tally(
        len(got), len(got) - len(distinct), len(expected - distinct), len(distinct - expected)
    )


class Load:
    """Produces `chunk` records every `pause` s (600 every 0.2 s: about 3,000 a second)
    round-robin over the topic's `partitions` until stopped; `produced` holds the offsets of
    every record."""

    def __init__(
        self, bootstrap: str, topic: str, partitions: int, *, chunk: int = 600, pause: float = 0.2
    ) -> None:
        self.produced = Produced()
        self._args = (bootstrap, topic, partitions, chunk, pause)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="test-load", daemon=True)

    def _run(self) -> None:
        bootstrap, topic, partitions, chunk, pause = self._args
        start = 0
        while not self._stop.wait(pause):
            self.produced |= produce(bootstrap, topic, chunk, partitions=partitions, start=start)
            start += chunk

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=120)
        assert not self._thread.is_alive(), "the producer did not stop"
