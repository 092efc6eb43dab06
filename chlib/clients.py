"""A pool of ClickHouse clients, kept across the tasks one process runs.

A new clickhouse-connect client costs a round trip before its first insert (it reads the
server's version and settings): 13 ms here, two thirds of a one-row task. A process that runs
task after task (a Spark Python worker, with `spark.python.worker.reuse`) keeps only module
state from one task to the next, so its tasks take their clients from the one `ClientPool` of
the process (`worker_pool`). A client whose request failed is closed and forgotten, so the
next task connects afresh to a restarted or replaced server.
"""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

from chlib.connection import Connection

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

_Key = tuple[Connection, tuple[tuple[str, int], ...], str]


class ClientPool:
    """Idle clients by (connection, hosts, database), at most `limit` of them (the least
    recently used is closed). A client is lent to one caller at a time."""

    def __init__(self, limit: int = 8) -> None:
        self._limit = limit
        self._idle: OrderedDict[_Key, Client] = OrderedDict()
        self._lock = threading.Lock()

    @contextmanager
    def client(
        self, connection: Connection, hosts: Sequence[tuple[str, int]], database: str
    ) -> Iterator[Client]:
        """An idle client, or a new one for the first of `hosts` that accepts a connection
        (the last error otherwise); back to the pool when the block ends, closed instead if the
        block raised."""
        key = (connection, tuple(hosts), database)
        with self._lock:
            client = self._idle.pop(key, None)
        if client is None:
            client = connect(connection, hosts, database)
        try:
            yield client
        except BaseException:
            client.close()
            raise
        with self._lock:
            self._idle[key] = client
            while len(self._idle) > self._limit:
                self._idle.popitem(last=False)[1].close()

    def close(self) -> None:
        """Close every idle client."""
        with self._lock:
            idle, self._idle = list(self._idle.values()), OrderedDict()
        for client in idle:
            client.close()


def connect(connection: Connection, hosts: Sequence[tuple[str, int]], database: str) -> Client:
    """A new client for the first of `hosts` that accepts a connection (the last error
    otherwise)."""
    error: Exception | None = None
    for host, port in hosts:
        try:
            return connection.client(host, port, database)
        except Exception as exc:
            error = exc
    if error is None:
        raise ValueError("no ClickHouse host given")
    raise error


@functools.cache
def worker_pool() -> ClientPool:
    """The pool of this process: what its next task (a reused Spark worker's) finds again."""
    return ClientPool()
