"""fsync policies and the background group-commit thread of the `interval` policy."""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable

_JOIN_TIMEOUT_S = 30.0


class FsyncPolicy(enum.StrEnum):
    """When appended records are made durable (fdatasync of the active segment).

    ALWAYS: before append() returns. BATCH: when the caller calls sync(). INTERVAL: by a
    background thread every `interval_ms` (group commit), and on sync()/close(). OFF: only on an
    explicit sync(); a power loss may lose anything, a process crash loses nothing written.
    Whatever the policy, a segment is fdatasynced before the next one is created (unless OFF),
    so durable data is always a prefix of the log.
    """

    ALWAYS = "always"
    BATCH = "batch"
    INTERVAL = "interval"
    OFF = "off"


class IntervalSyncer:
    """Calls `sync` every `interval_s` seconds in a daemon thread until stop().

    If `sync` raises, the thread keeps the exception in `error` and ends; the owner checks it.
    """

    def __init__(self, sync: Callable[[], None], interval_s: float, name: str):
        self._sync = sync
        self._interval_s = interval_s
        self._stopping = threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopping.wait(self._interval_s):
            try:
                self._sync()
            except BaseException as exc:  # handed to the owner through `error`
                self.error = exc
                return

    def stop(self) -> None:
        """Stop the thread and wait for it (bounded); safe to call more than once."""
        self._stopping.set()
        self._thread.join(_JOIN_TIMEOUT_S)
