"""Arrow Flight query service: ``do_get`` with an SQL ticket, ``list_flights`` of the tables."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping

import pyarrow as pa
import pyarrow.flight as fl

from buffer.auth import bearer_ok
from buffer.client import FORWARDED_BY, FORWARDED_BY_HEADER
from buffer.limits import ServerLimits
from buffer.snapshot import Snapshot
from buffer.sql import Forward, QueryError, QueryRefusedError, QueryTimeoutError, SqlEngine
from buffer.tls import ServerTls


class _BearerFactory(fl.ServerMiddlewareFactory):  # type: ignore[misc]
    def __init__(self, token: str | None) -> None:
        super().__init__()
        self._token = token

    def start_call(self, info: fl.CallInfo, headers: dict[str, list[str]]) -> None:
        values = headers.get("authorization") or []
        if not bearer_ok(self._token, values[0] if values else None):
            raise fl.FlightUnauthenticatedError("missing or wrong bearer token")


class _ForwardedBy(fl.ServerMiddleware):  # type: ignore[misc]
    def __init__(self, node: str) -> None:
        super().__init__()
        self.node = node


class _ForwardedByFactory(fl.ServerMiddlewareFactory):  # type: ignore[misc]
    """Notes the node a call was forwarded by (its header), for `forward`'s hop guard."""

    def start_call(self, info: fl.CallInfo, headers: dict[str, list[str]]) -> _ForwardedBy | None:
        values = headers.get(FORWARDED_BY_HEADER) or []
        return _ForwardedBy(str(values[0])) if values else None


def _raise_flight_error(exc: QueryError) -> None:
    if isinstance(exc, QueryRefusedError):
        raise fl.FlightUnauthorizedError(str(exc)) from exc
    if isinstance(exc, QueryTimeoutError):
        raise fl.FlightTimedOutError(str(exc)) from exc
    # Flight has no error class for INVALID_ARGUMENT; pyarrow sends ArrowInvalid as that
    # status. It also sends the traceback as detail: "from None" keeps DuckDB's frames out.
    raise pa.ArrowInvalid(str(exc)) from None


class FlightQueryServer(fl.FlightServerBase):  # type: ignore[misc]
    """Serves ``engine`` on grpc://host:port, or grpc+tls://host:port with ``tls``; port 0
    picks a free port (see ``port``).

    ``do_get``: the ticket is UTF-8 SQL; the result streams as Arrow. Errors: bad SQL and
    row limit -> invalid argument (the client raises ``pyarrow.ArrowInvalid`` with the
    engine's message first), refused -> unauthorized, timeout -> timed out; a wrong or
    missing token when ``token`` is set -> unauthenticated. ``forward`` may answer a query
    elsewhere first (a ticket is only SQL: its one parameter is ``FORWARDED_BY``, the node
    named by a call's ``FORWARDED_BY_HEADER``); if it fails, the client gets an unavailable
    error naming why. A ticket that is not UTF-8 gets a server error saying
    so; over ``limits.max_concurrent_queries`` running queries, an unavailable error at once.
    Errors of the Flight kinds carry no server traceback (pyarrow attaches one to any other
    exception, ``ArrowInvalid`` included, so bad SQL's answer names this module's frames).
    It serves from construction until ``shutdown()``. Do not call ``serve()`` in a process
    that handles signals: it only waits, and while it waits Arrow's own SIGINT/SIGTERM
    handler replaces the process's; with a second Flight server in the process (a flush
    handoff) that handler ends up acting for neither, and SIGTERM is lost.
    """

    def __init__(
        self,
        engine: SqlEngine,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | None = None,
        *,
        forward: Forward | None = None,
        limits: ServerLimits | None = None,
        tls: ServerTls | None = None,
    ) -> None:
        self._scheme = "grpc" if tls is None else "grpc+tls"
        super().__init__(
            f"{self._scheme}://{host}:{port}",
            tls_certificates=[] if tls is None else [fl.CertKeyPair(*tls.pem())],
            middleware={"auth": _BearerFactory(token), "forwarded_by": _ForwardedByFactory()},
        )
        self.engine = engine
        self.host = host
        self._forward = forward
        self._cap = (limits or ServerLimits()).max_concurrent_queries
        self._queries = threading.BoundedSemaphore(self._cap)

    @property
    def location(self) -> str:
        """The URL clients connect to."""
        return f"{self._scheme}://{self.host}:{self.port}"

    def do_get(self, context: fl.ServerCallContext, ticket: fl.Ticket) -> fl.RecordBatchStream:
        try:
            sql = ticket.ticket.decode()
        except UnicodeDecodeError as exc:
            raise fl.FlightServerError(f"the ticket is not UTF-8 SQL: {exc.reason}") from None
        if not self._queries.acquire(blocking=False):
            raise fl.FlightUnavailableError(f"{self._cap} queries running; retry later")
        hop = context.get_middleware("forwarded_by")
        try:
            return self._answer(sql, {} if hop is None else {FORWARDED_BY: hop.node})
        finally:
            self._queries.release()

    def _answer(self, sql: str, params: Mapping[str, str]) -> fl.RecordBatchStream:
        try:
            forwarded = self._forward(sql, params) if self._forward is not None else None
        except Exception as exc:  # the place it forwards to is unreachable or refused it
            why = f"forward failed: {type(exc).__name__}: {exc}"
            raise fl.FlightUnavailableError(why) from None
        if forwarded is not None:
            return fl.RecordBatchStream(forwarded)
        try:
            table = self.engine.query(sql)
        except QueryError as exc:
            _raise_flight_error(exc)
        return fl.RecordBatchStream(table)

    def _info(self, snap: Snapshot) -> fl.FlightInfo:
        endpoint = fl.FlightEndpoint(f'SELECT * FROM "{snap.name}"', [self.location])
        return fl.FlightInfo(
            snap.schema, fl.FlightDescriptor.for_path(snap.name), [endpoint], snap.rows, snap.nbytes
        )

    def list_flights(
        self, context: fl.ServerCallContext, criteria: bytes
    ) -> Iterator[fl.FlightInfo]:
        """One FlightInfo per table: path descriptor = name, schema, row and byte counts."""
        for snap in self.engine.catalog.snapshots():
            yield self._info(snap)

    def get_flight_info(
        self, context: fl.ServerCallContext, descriptor: fl.FlightDescriptor
    ) -> fl.FlightInfo:
        """The FlightInfo of the table named by a path descriptor."""
        for snap in self.engine.catalog.snapshots():
            if descriptor.path == [snap.name.encode()]:
                return self._info(snap)
        raise KeyError(f"no table {descriptor.path!r}")
