"""Copies of pushed batches that other nodes' leaders sent here, so that an answered push
survives its leader's node (`push_replicas.py` sends and gathers them).

One folder per pipeline and shard under `<data_dir>/push-replicas/`, one file per batch:
`<partition>_<sequence>_<rows>.arrows`, the batch's rows (the pipeline's rows schema, meta
columns set) as an Arrow IPC stream, written to a temporary name, fsynced, renamed and the
folder fsynced: a file that is there under its name is whole. `fence` holds the highest
epoch a new leader gathered the copies with; a copy from an older epoch is refused from then
on (its leader lost the shard: an answer it would give could not reach the new leader).
"""

from __future__ import annotations

import json
import os
import re
import struct
import threading
from dataclasses import dataclass
from pathlib import Path

from hakafka.coordination import paths
from hakafka.pipeline.push import first_offset

_NAME = re.compile(r"(-?\d+)_(\d+)_(\d+)\.arrows")


class StaleEpochError(Exception):
    """A copy sent by a leader whose epoch is below the fence: the message names both."""


@dataclass(frozen=True)
class StoredBatch:
    """One pushed batch's copy: its writer partition, sequence, row count and IPC bytes."""

    partition: int
    sequence: int
    rows: int
    body: bytes

    @property
    def end(self) -> int:
        """The offset after its last row."""
        return first_offset(self.sequence) + self.rows


class ReplicaStore:
    """The copies this node holds, for every pipeline and shard (thread-safe)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._lock = threading.Lock()

    def store(self, pipeline: str, shard: int, epoch: int, batch: StoredBatch, trim: int) -> None:
        """Keep `batch` (durably: see the module); drop the copies of its writer that end at
        or below `trim` (its checkpoint). StaleEpochError below the fence."""
        folder = self._folder(pipeline, shard)
        with self._lock:
            fence = _read_fence(folder)
            if epoch < fence:
                raise StaleEpochError(
                    f"a copy from epoch {epoch}, but a leader of epoch {fence} gathered "
                    f"{pipeline}/{shard}'s copies: the sender no longer leads"
                )
            folder.mkdir(parents=True, exist_ok=True)
            name = f"{batch.partition}_{batch.sequence}_{batch.rows}.arrows"
            _write_durably(folder, name, batch.body)
            for old in self._batches(folder):
                if old.partition == batch.partition and old.end <= trim:
                    (folder / f"{old.partition}_{old.sequence}_{old.rows}.arrows").unlink()

    def gather(self, pipeline: str, shard: int, epoch: int) -> list[StoredBatch]:
        """Every copy held for `pipeline` of `shard`, raising the fence to `epoch` first (so
        no older leader's copy lands after this answer)."""
        folder = self._folder(pipeline, shard)
        with self._lock:
            if epoch > _read_fence(folder):
                folder.mkdir(parents=True, exist_ok=True)
                _write_durably(folder, "fence", str(epoch).encode())
            found = self._batches(folder)
        return [
            StoredBatch(b.partition, b.sequence, b.rows, (folder / _file(b)).read_bytes())
            for b in found
        ]

    def _folder(self, pipeline: str, shard: int) -> Path:
        return self.root / paths.check_name("pipeline", pipeline) / str(shard)

    @staticmethod
    def _batches(folder: Path) -> list[StoredBatch]:
        """The copies in `folder`, bodies not read (empty)."""
        if not folder.is_dir():
            return []
        found = []
        for entry in folder.iterdir():
            if match := _NAME.fullmatch(entry.name):
                p, s, n = (int(g) for g in match.groups())
                found.append(StoredBatch(p, s, n, b""))
        return sorted(found, key=lambda b: (b.partition, b.sequence))


def _file(batch: StoredBatch) -> str:
    return f"{batch.partition}_{batch.sequence}_{batch.rows}.arrows"


def _read_fence(folder: Path) -> int:
    try:
        return int((folder / "fence").read_text())
    except (FileNotFoundError, ValueError):
        return 0


def _write_durably(folder: Path, name: str, body: bytes) -> None:
    temporary = folder / f".{name}.tmp"
    with temporary.open("wb") as out:
        out.write(body)
        out.flush()
        os.fsync(out.fileno())
    os.replace(temporary, folder / name)
    directory = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def encode_batches(batches: list[StoredBatch]) -> bytes:
    """`batches` as one body: per batch a 4-byte header length, its JSON header, an 8-byte
    body length and the body."""
    out = bytearray()
    for b in batches:
        header = json.dumps({"p": b.partition, "s": b.sequence, "n": b.rows}).encode()
        out += struct.pack(">I", len(header)) + header + struct.pack(">Q", len(b.body)) + b.body
    return bytes(out)


def decode_batches(raw: bytes) -> list[StoredBatch]:
    """What `encode_batches` made; ValueError naming the byte position of a torn frame."""
    found, at = [], 0
    while at < len(raw):
        try:
            (size,) = struct.unpack_from(">I", raw, at)
            header = json.loads(raw[at + 4 : at + 4 + size])
            (length,) = struct.unpack_from(">Q", raw, at + 4 + size)
        except (struct.error, ValueError) as exc:
            raise ValueError(f"replica batches: a torn frame at byte {at}: {exc}") from None
        start = at + 12 + size
        if start + length > len(raw):
            raise ValueError(f"replica batches: a frame at byte {at} runs past the end")
        found.append(
            StoredBatch(
                int(header["p"]), int(header["s"]), int(header["n"]), raw[start : start + length]
            )
        )
        at = start + length
    return found
