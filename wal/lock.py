"""The directory lock: one writer per WAL directory, a second one fails at once."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from wal.errors import WalLockedError

LOCK_NAME = "LOCK"


class DirectoryLock:
    """An exclusive flock on `<directory>/LOCK`, holding the owner's PID as text.

    The kernel drops the lock when the holder's process dies, so a crash never leaves it stale.
    """

    def __init__(self, directory: Path):
        """Take the lock now; raises WalLockedError (naming the directory and holder) if held."""
        self.path = directory / LOCK_NAME
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
            os.close(fd)
            raise WalLockedError(
                f"WAL directory {directory} is locked by another writer (pid {holder}); "
                f"only one process may write a WAL directory at a time"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
        self._fd: int | None = fd

    def release(self) -> None:
        """Drop the lock; safe to call more than once."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
