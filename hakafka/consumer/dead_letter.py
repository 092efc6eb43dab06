"""Dead-letter rows: bad messages with their coordinates, raw bytes and the error text.

A key or value longer than the pipeline's `dead_letter_bytes` keeps only its first bytes, and
the error text says so with the full length and its SHA-256, so that a flood of huge bad
messages cannot fill the buffer and the table while each stays identifiable in Kafka.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import pyarrow as pa

from hakafka.consumer.messages import MessageColumns, kafka_timestamps
from hakafka.consumer.schema import dead_letter_arrow_schema


def dead_letter_table_name(table: str) -> str:
    """Name of the dead-letter table that goes with `table`."""
    return f"{table}_dead_letter"


def truncated(what: str, data: bytes, keep: int) -> tuple[bytes, str]:
    """`data` cut to its first `keep` bytes, and the note to append to the error text (empty
    when nothing was cut)."""
    if len(data) <= keep:
        return data, ""
    digest = hashlib.sha256(data).hexdigest()
    return data[:keep], (
        f" [{what} truncated: first {keep} of {len(data)} bytes kept, sha256 {digest}]"
    )


def dead_letter_batch(
    columns: MessageColumns, errors: Mapping[int, str], keep_bytes: int
) -> pa.RecordBatch:
    """One row per `errors` entry (message index -> error text), in message order.

    Columns are `schema.DEAD_LETTER_COLUMNS`; `_key` and `_value` hold the message's raw bytes,
    cut to their first `keep_bytes` (the error text then gives the full length and hash).
    """
    idx = sorted(errors)
    keys: list[bytes | None] = []
    values: list[bytes] = []
    texts: list[str] = []
    for i in idx:
        key: bytes | None = columns.keys[i]
        key_note = ""
        if key is not None:
            key, key_note = truncated("_key", key, keep_bytes)
        value, value_note = truncated("_value", columns.values[i] or b"", keep_bytes)
        keys.append(key)
        values.append(value)
        texts.append(errors[i] + key_note + value_note)
    arrays = [
        pa.array([columns.topics[i] for i in idx], pa.string()),
        pa.array([columns.partitions[i] for i in idx], pa.int32()),
        pa.array([columns.offsets[i] for i in idx], pa.int64()),
        kafka_timestamps([columns.timestamps[i] for i in idx]),
        pa.array(keys, pa.binary()),
        pa.array(values, pa.binary()),
        pa.array(texts, pa.string()),
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=dead_letter_arrow_schema())
