"""How a pipeline's consumed batch is stored in the WAL, and read back on replay.

One WAL record per consumed batch. The header is small JSON: the pipeline name, the exact
offset range per (topic, partition) of every message in the batch (good and bad), the row
counts and the length of the first IPC stream. The payload is the decoded rows as an Arrow
IPC stream, followed by the dead-letter rows as a second IPC stream when there are any.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

import pyarrow as pa

from buffer import OffsetRange
from wal import Record

FORMAT_VERSION = 1

Ranges = Mapping[tuple[str, int], OffsetRange]


class WalRecordError(ValueError):
    """A WAL record passed its CRC but is not a record this codec wrote (names its position)."""


@dataclass(frozen=True)
class WalBatch:
    """One consumed batch: its rows, its dead letters and the offsets it covers."""

    pipeline: str
    ranges: Ranges
    rows: pa.RecordBatch
    dead_letters: pa.RecordBatch | None = None


def _ipc(batch: pa.RecordBatch) -> pa.Buffer:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue()


def encode(batch: WalBatch) -> tuple[bytes, bytes | pa.Buffer]:
    """The (header, payload) to append for `batch`."""
    rows = _ipc(batch.rows)
    dead = _ipc(batch.dead_letters) if batch.dead_letters is not None else None
    header = {
        "v": FORMAT_VERSION,
        "pipeline": batch.pipeline,
        "ranges": [[t, p, r.first, r.last] for (t, p), r in sorted(batch.ranges.items())],
        "rows": batch.rows.num_rows,
        "dead": batch.dead_letters.num_rows if batch.dead_letters is not None else 0,
        "rows_ipc": rows.size,
    }
    encoded = json.dumps(header, separators=(",", ":")).encode()
    if dead is None:
        return encoded, rows
    return encoded, rows.to_pybytes() + dead.to_pybytes()


def decode_header(record: Record) -> dict[str, object]:
    """The JSON header of `record`, or WalRecordError naming the record's position."""
    try:
        header = json.loads(record.header)
    except ValueError as exc:
        raise WalRecordError(
            f"WAL record at {record.position}: header is not JSON ({exc})"
        ) from None
    if not isinstance(header, dict) or header.get("v") != FORMAT_VERSION:
        raise WalRecordError(f"WAL record at {record.position}: unknown header format")
    return header


def ranges_of(header: Mapping[str, object]) -> dict[tuple[str, int], OffsetRange]:
    raw = header["ranges"]
    assert isinstance(raw, list)
    return {(str(t), int(p)): OffsetRange(int(first), int(last)) for t, p, first, last in raw}


def decode(record: Record) -> WalBatch:
    """The batch stored in `record` (zero-copy over the record's payload)."""
    header = decode_header(record)
    payload = pa.py_buffer(record.payload)
    split = header["rows_ipc"]
    assert isinstance(split, int)
    try:
        rows = _read_one(payload.slice(0, split))
        dead = _read_one(payload.slice(split)) if header.get("dead") else None
    except (pa.ArrowInvalid, ValueError) as exc:
        raise WalRecordError(
            f"WAL record at {record.position}: Arrow payload unreadable ({exc})"
        ) from None
    return WalBatch(str(header["pipeline"]), ranges_of(header), rows, dead)


def _read_one(buf: pa.Buffer) -> pa.RecordBatch:
    reader = pa.ipc.open_stream(buf)
    batches = list(reader)
    if len(batches) != 1:
        raise ValueError(f"expected one record batch, found {len(batches)}")
    return batches[0]
