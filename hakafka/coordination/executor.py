"""A serial executor: one daemon thread that runs submitted callables in order.

ZooKeeper watch and state callbacks run on kazoo's threads and must never block, so they only
submit work here; the coordination logic then runs on one thread, one step at a time.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import TypeVar

import structlog

T = TypeVar("T")
log = structlog.get_logger("hakafka.coordination")


class SerialExecutor:
    """Runs callables on one thread in submission order; exceptions are logged, not raised."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._queue: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._stopped = False
        self._thread.start()

    def submit(self, fn: Callable[[], T]) -> Future[T]:
        """Queue `fn`; its result or exception ends up in the returned future."""
        future: Future[T] = Future()

        def run() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(fn())
            except BaseException as exc:
                future.set_exception(exc)
                log.warning("coordination.task_failed", executor=self._name, error=repr(exc))

        if self._stopped:
            future.set_exception(RuntimeError(f"executor {self._name} is stopped"))
        else:
            self._queue.put(run)
        return future

    def on_thread(self) -> bool:
        """True when called from this executor's own thread."""
        return threading.current_thread() is self._thread

    def stop(self, timeout: float) -> None:
        """Run what is queued, then stop the thread (waits at most `timeout` s)."""
        self._stopped = True
        self._queue.put(None)
        if not self.on_thread():
            self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            task = self._queue.get()
            if task is None:
                return
            task()
