"""Reserving disk blocks for the active segment ahead of its writes, and giving the rest back.

Writing into blocks reserved with Linux `fallocate(FALLOC_FL_KEEP_SIZE)` spares each fdatasync the
block allocation it would otherwise commit (RocksDB reserves its WAL files the same way). The file
size does not change, so readers, repair and `segments()` see only what was written.
"""

from __future__ import annotations

import ctypes
import functools
import os
from collections.abc import Callable

_FALLOC_FL_KEEP_SIZE = 1

_Fallocate = Callable[[int, int, ctypes.c_int64, ctypes.c_int64], int]


@functools.cache
def _fallocate() -> _Fallocate | None:
    """libc's fallocate(2), or None where the C library has none (not Linux)."""
    try:
        function = ctypes.CDLL(None, use_errno=True).fallocate
    except AttributeError:
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    function.restype = ctypes.c_int
    return function


def reserve(fd: int, nbytes: int) -> bool:
    """Allocate the first `nbytes` of the file behind `fd` without changing its size.

    Returns False, changing nothing, where the platform or file system cannot do it or the disk
    lacks the room: the reservation only saves time, a later write allocates what it needs.
    """
    fallocate = _fallocate()
    if fallocate is None:
        return False
    return fallocate(fd, _FALLOC_FL_KEEP_SIZE, ctypes.c_int64(0), ctypes.c_int64(nbytes)) == 0


def release(fd: int) -> None:
    """Free the blocks reserved past the end of the file behind `fd` (its size stays as it is)."""
    os.ftruncate(fd, os.fstat(fd).st_size)
