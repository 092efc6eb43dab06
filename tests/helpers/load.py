"""`Load`: records produced in the background while a test moves leadership around."""

from __future__ import annotations

import threading

from devstack.records import Produced, produce


class Load:
    """Produces `chunk` records every `pause` s (600 every 0.2 s: about 3,000 a second)
    round-robin over the topic's `partitions` until stopped; `produced` holds the offsets of
    every record."""

    def __init__(
        self, bootstrap: str, topic: str, partitions: int, *, chunk: int = 600, pause: float = 0.2
    ) -> None:
        self.produced = Produced()
        self._args = (bootstrap, topic, partitions, chunk, pause)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="test-load", daemon=True)

    def _run(self) -> None:
        bootstrap, topic, partitions, chunk, pause = self._args
        start = 0
        while not self._stop.wait(pause):
            self.produced |= produce(bootstrap, topic, chunk, partitions=partitions, start=start)
            start += chunk

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=120)
        assert not self._thread.is_alive(), "the producer did not stop"
