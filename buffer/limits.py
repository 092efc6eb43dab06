"""Bounds on what one client can make the query servers hold: bytes, time, threads."""

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
