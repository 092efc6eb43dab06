"""A transactional producer for tests: each commit or abort writes a marker, an offset that no
consumer sees, so the log has offsets without a message (tansu supports transactions; it
has no DeleteRecords)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from confluent_kafka import Producer

Transaction = tuple[Sequence[tuple[int, bytes]], bool]
"""(partition, value) records, then commit (True) or abort (False)."""


def produce_transactions(
    bootstrap: str, topic: str, transactions: Sequence[Transaction], transactional_id: str = ""
) -> list[tuple[int, int]]:
    """Produce each transaction and commit or abort it; returns the (partition, offset) of
    every committed record, in production order."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": transactional_id or f"{topic}-tx",
            "linger.ms": 5,
        }
    )
    producer.init_transactions(15)
    committed: list[tuple[int, int]] = []
    for records, commit in transactions:
        delivered: list[Any] = []
        producer.begin_transaction()
        for partition, value in records:
            producer.produce(
                topic,
                value=value,
                partition=partition,
                on_delivery=lambda err, msg: delivered.append((err, msg)),  # noqa: B023
            )
        if not commit:
            producer.abort_transaction(15)
            continue
        producer.commit_transaction(15)  # flushes: every delivery report is in
        assert len(delivered) == len(records), (len(delivered), len(records))
        for err, msg in delivered:
            assert err is None, err
            committed.append((msg.partition(), msg.offset()))
    return committed
