"""`hakafka push`: a file's rows pushed into a pipeline's buffer on a shard's leader, in
batches of a fixed number of rows, each acknowledged once flushed (`buffer.push_client`).

Batch k of the file (rows k*N to (k+1)*N - 1) is sequence `first_sequence + k` of the writer,
and the default writer is named after the file's path: a command killed half-way and run
again pushes the same batches under the same identities, and the leader applies each once
(those applied before are answered as duplicates).
"""

from __future__ import annotations

import csv
import hashlib
import io
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.json as pa_json

from buffer.push_client import Pushed, Pusher
from hakafka.ops.cluster import OpsError, UsageError

PROGRESS_S = 1.0  # at most one progress line a second


class FileReadError(OpsError):
    """The file cannot be read as its format; the message names the file and where."""


class FileFormat(StrEnum):
    """What `hakafka push` reads (`--format`, else from the file's extension)."""

    CSV = "csv"
    """With a header line naming the columns; values are read as text and cast by the
    leader to the pipeline's types (an empty field is null)."""
    JSON_EACH_ROW = "jsoneachrow"
    """One JSON object per line."""
    ARROW = "arrow"
    """An Arrow IPC stream or file."""


_EXTENSIONS = {
    ".csv": FileFormat.CSV,
    ".json": FileFormat.JSON_EACH_ROW,
    ".jsonl": FileFormat.JSON_EACH_ROW,
    ".ndjson": FileFormat.JSON_EACH_ROW,
    ".arrow": FileFormat.ARROW,
    ".arrows": FileFormat.ARROW,
    ".feather": FileFormat.ARROW,
    ".ipc": FileFormat.ARROW,
}


def file_format(path: Path, given: str | None) -> FileFormat:
    """The format named, or the one of `path`'s extension; UsageError if neither says."""
    if given is not None:
        return FileFormat(given)
    found = _EXTENSIONS.get(path.suffix.lower())
    if found is None:
        known = ", ".join(sorted(_EXTENSIONS))
        raise UsageError(f"{path}: name its format with --format (or use one of {known})")
    return found


def default_writer(path: Path) -> str:
    """The writer of `path` when none is named: the same for every run over the same file."""
    digest = hashlib.blake2b(str(path.resolve()).encode(), digest_size=6).hexdigest()
    return f"push-{digest}"


@dataclass
class Progress:
    """What a push did so far."""

    rows: int = 0
    batches: int = 0
    duplicates: int = 0
    """Batches applied before (an earlier run): acknowledged, not applied again."""
    bytes_read: int = 0


def batches(path: Path, fmt: FileFormat, rows: int, progress: Progress) -> Iterator[pa.Table]:
    """`path`'s rows in batches of exactly `rows` (the last may hold fewer), the same cut on
    every run; `progress.bytes_read` follows the file's position."""
    with path.open("rb") as raw:
        counted = _Counted(raw, progress)
        match fmt:
            case FileFormat.CSV:
                source = _csv(counted, path)
            case FileFormat.JSON_EACH_ROW:
                source = _json_lines(counted, rows, path)
            case FileFormat.ARROW:
                source = _arrow(counted, path)
        yield from _exactly(source, rows)


def push_file(
    pusher: Pusher,
    chunks: Iterator[pa.Table],
    progress: Progress,
    *,
    first_sequence: int,
    report: Callable[[Progress, float], None],
) -> Progress:
    """Push `chunks` as sequences from `first_sequence`, one at a time (each acknowledged
    before the next), calling `report(progress, seconds)` at most once a second."""
    began = last = time.monotonic()
    for index, chunk in enumerate(chunks):
        answer: Pushed = pusher.push(first_sequence + index, chunk)
        progress.batches += 1
        progress.rows += answer.rows
        progress.duplicates += answer.duplicate
        now = time.monotonic()
        if now - last >= PROGRESS_S:
            report(progress, now - began)
            last = now
    return progress


class _Counted(io.RawIOBase):
    """A file read through, counting its bytes into `progress`."""

    def __init__(self, raw: io.BufferedReader, progress: Progress) -> None:
        self._raw, self._progress = raw, progress

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        n = self._raw.readinto(buffer)
        self._progress.bytes_read += n or 0
        return n or 0


def _csv(stream: io.RawIOBase, path: Path) -> Iterator[pa.RecordBatch]:
    with path.open(encoding="utf-8", newline="") as text:
        header = next(csv.reader(text), None)
    if not header:
        raise FileReadError(f"{path}: no header line naming the columns")
    options = pa_csv.ConvertOptions(
        column_types=dict.fromkeys(header, pa.string()), strings_can_be_null=True
    )
    try:
        yield from pa_csv.open_csv(io.BufferedReader(stream), convert_options=options)
    except pa.ArrowInvalid as exc:
        raise FileReadError(f"{path}: not CSV as its header says: {exc}") from None


def _json_lines(stream: io.RawIOBase, rows: int, path: Path) -> Iterator[pa.Table]:
    lines: list[bytes] = []
    number = 0  # of the last line read
    for number, line in enumerate(io.BufferedReader(stream), 1):
        if line.strip():
            lines.append(line)
        if len(lines) == rows:
            yield _parsed(lines, path, number)
            lines = []
    if lines:
        yield _parsed(lines, path, number)


def _parsed(lines: list[bytes], path: Path, last: int) -> pa.Table:
    try:
        return pa_json.read_json(io.BytesIO(b"".join(lines)))
    except pa.ArrowInvalid as exc:
        raise FileReadError(
            f"{path}: the {len(lines)} rows up to line {last} are not JSONEachRow: {exc}"
        ) from None


def _arrow(stream: io.RawIOBase, path: Path) -> Iterator[pa.RecordBatch]:
    data = io.BufferedReader(stream).read()
    try:
        reader = pa.ipc.open_file(data)
    except pa.ArrowInvalid:
        try:
            yield from pa.ipc.open_stream(data)
        except pa.ArrowInvalid as exc:
            raise FileReadError(f"{path}: not an Arrow IPC stream or file: {exc}") from None
        return
    for i in range(reader.num_record_batches):
        yield reader.get_batch(i)


def _exactly(source: Iterator[pa.Table | pa.RecordBatch], rows: int) -> Iterator[pa.Table]:
    """`source` cut into tables of `rows` rows (the last may hold fewer)."""
    held: list[pa.Table] = []
    count = 0
    for part in source:
        table = part if isinstance(part, pa.Table) else pa.Table.from_batches([part])
        held.append(table)
        count += table.num_rows
        while count >= rows:
            whole = pa.concat_tables(held, promote_options="permissive")
            yield whole.slice(0, rows)
            rest = whole.slice(rows)
            held, count = [rest], rest.num_rows
    if count:
        yield pa.concat_tables(held, promote_options="permissive")


def describe(progress: Progress, seconds: float, size: int) -> str:
    """`120000 rows in 12 batches (2 applied before), 48% of 12.3 MiB, 45.1k rows/s`."""
    share = f"{100 * progress.bytes_read // size}% of {size / (1 << 20):.1f} MiB" if size else ""
    rate = progress.rows / seconds if seconds > 0 else 0.0
    before = f" ({progress.duplicates} applied before)" if progress.duplicates else ""
    return (
        f"{progress.rows} rows in {progress.batches} batches{before}, {share}, "
        f"{rate / 1000:.1f}k rows/s"
    )


def file_size(path: Path) -> int:
    return os.stat(path).st_size
