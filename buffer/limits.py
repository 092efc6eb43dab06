"""Bounds on what one client can make the query servers hold: bytes, time, threads, disk."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ServerLimits:
    """Per-server bounds shared by the HTTP and Flight query servers.

    ``max_request_bytes``: the largest request body (an SQL text) read; ``request_timeout``:
    seconds a socket read may wait for the client (headers, body, the next keep-alive request);
    ``max_connections``: HTTP connections served at once (each holds a thread);
    ``max_concurrent_queries``: queries run at once, per server. Over a cap the server answers
    "busy" at once instead of queueing work.
    """

    max_request_bytes: int = 1 << 20
    request_timeout: float = 10.0
    max_connections: int = 64
    max_concurrent_queries: int = 4


@dataclass(frozen=True)
class QueryLimits:
    """Per-query bounds of the SQL engine; a query past one fails with an error naming it.

    ``timeout_s``: wall-clock seconds from the start of a query to the last byte of its
    encoded answer. ``max_rows`` and ``max_result_bytes``: the result's rows, and its bytes
    counted twice, as Arrow batches while DuckDB produces them and as encoded output (JSON,
    CSV, Arrow IPC), each against the same cap. ``memory_bytes`` and ``threads``: DuckDB's
    ``memory_limit`` (shared by the queries running at once) and its threads (one query
    runs on at most this many cores). ``max_spill_bytes``: how much DuckDB may write to
    ``spill_dir`` when a query's sorts, joins or aggregates outgrow memory; 0 (the default)
    turns spilling off, so such a query fails instead.
    """

    timeout_s: float = 10.0
    max_rows: int = 1_000_000
    max_result_bytes: int = 64 << 20
    memory_bytes: int = 1 << 30
    threads: int = 1
    max_spill_bytes: int = 0
    spill_dir: str = ""

    def __post_init__(self) -> None:
        for name in ("timeout_s", "max_rows", "max_result_bytes", "memory_bytes", "threads"):
            if getattr(self, name) <= 0:
                raise ValueError(f"QueryLimits.{name} must be > 0, got {getattr(self, name)}")
        if self.max_spill_bytes < 0 or (self.max_spill_bytes > 0 and not self.spill_dir):
            raise ValueError(
                f"QueryLimits.max_spill_bytes = {self.max_spill_bytes} needs a spill_dir "
                "(and may not be negative)"
            )
