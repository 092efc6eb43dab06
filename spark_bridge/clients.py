"""ClickHouse clients kept across the write tasks one Spark Python worker runs.

A new clickhouse-connect client costs a round trip before its first insert (it reads the
server's version and settings): 13 ms here, two thirds of a one-row task. Spark hands a
worker process the next task (`spark.python.worker.reuse`), and module state is all a task
leaves to the next, so the writer's tasks take their clients from the one `ClientPool` of
their process (`worker_pool`). A client whose request failed is closed and forgotten, so the
next task connects afresh to a restarted or replaced server.
"""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

from spark_bridge.connection import Connection

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
    """The pool of this process: what a Spark worker's next task finds again."""
    return ClientPool()
