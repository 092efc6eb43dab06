"""Dead-letter rows: bad messages with their coordinates, raw bytes and the error text."""

from __future__ import annotations

from collections.abc import Mapping

import pyarrow as pa

from hakafka.consumer.messages import MessageColumns, kafka_timestamps
from hakafka.consumer.schema import dead_letter_arrow_schema


def dead_letter_table_name(table: str) -> str:
    """Name of the dead-letter table that goes with `table`."""
    return f"{table}_dead_letter"


def dead_letter_batch(columns: MessageColumns, errors: Mapping[int, str]) -> pa.RecordBatch:
    """One row per `errors` entry (message index -> error text), in message order.

    Columns are `schema.DEAD_LETTER_COLUMNS`; `_value` holds the message's raw bytes.
    """
    idx = sorted(errors)
    arrays = [
        pa.array([columns.topics[i] for i in idx], pa.string()),
        pa.array([columns.partitions[i] for i in idx], pa.int32()),
        pa.array([columns.offsets[i] for i in idx], pa.int64()),
        kafka_timestamps([columns.timestamps[i] for i in idx]),
        pa.array([columns.keys[i] for i in idx], pa.binary()),
        pa.array([columns.values[i] or b"" for i in idx], pa.binary()),
        pa.array([errors[i] for i in idx], pa.string()),
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=dead_letter_arrow_schema())
