"""Fixtures shared by the wal tests: deterministic records, filling and replaying a log."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from wal import Position, WriteAheadLog

Written = list[tuple[Position, bytes, bytes]]
WRITER_SCRIPT = Path(__file__).with_name("wal_kill_writer.py")


def _writer_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("wal_kill_writer", WRITER_SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def record_bytes() -> Callable[[int, int], tuple[bytes, bytes]]:
    """record_bytes(seq, size) -> (header, payload), as the SIGKILL helper writes them."""
    fn: Callable[[int, int], tuple[bytes, bytes]] = _writer_module().record_bytes
    return fn


@pytest.fixture
def fill_log(record_bytes: Callable[[int, int], tuple[bytes, bytes]]) -> Callable[..., Written]:
    """fill_log(dir, sizes, **open_kwargs): append one record per size, close, return them."""

    def fill(directory: Path, sizes: list[int], **kwargs: Any) -> Written:
        written: Written = []
        with WriteAheadLog.open(directory, **kwargs) as log:
            for seq, size in enumerate(sizes):
                header, payload = record_bytes(seq, size)
                written.append((log.append(header, payload), header, payload))
        return written

    return fill


@pytest.fixture
def replay_all() -> Callable[[Path], Written]:
    """replay_all(dir): open the log, replay every record, close it; (position, header, payload)."""

    def replay(directory: Path) -> Written:
        with WriteAheadLog.open(directory) as log:
            return [(r.position, r.header, bytes(r.payload)) for r in log.replay()]

    return replay


def flip_bits(path: Path, offset: int, mask: int) -> bytes:
    """XOR the byte at `offset` of file `path` with `mask`; return the file's new contents."""
    data = bytearray(path.read_bytes())
    data[offset] ^= mask
    path.write_bytes(bytes(data))
    return bytes(data)


@pytest.fixture
def flip() -> Callable[[Path, int, int], bytes]:
    """flip(path, offset, mask): damage one byte of a file in place; returns the new contents."""
    return flip_bits
