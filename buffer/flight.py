"""Arrow Flight query service: ``do_get`` with an SQL ticket, ``list_flights`` of the tables,
and ``do_put`` of batches into a handler the owner passes in."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator, Mapping

import pyarrow as pa
import pyarrow.flight as fl

from buffer.auth import bearer_ok
from buffer.client import FORWARDED_BY, FORWARDED_BY_HEADER, SHARD_HEADER
from buffer.http import Reply
from buffer.limits import ServerLimits
from buffer.observe import Outcome, QueryObserver, observed
from buffer.sql import (
    SHARD,
    Forward,
    QueryError,
    QueryRefusedError,
    QueryTimeoutError,
    SqlEngine,
    TableView,
    shard_of,
)
from buffer.tls import ServerTls


class _BearerFactory(fl.ServerMiddlewareFactory):  # type: ignore[misc]
    def __init__(self, token: str | None) -> None:
        super().__init__()
        self.token = token

    def start_call(self, info: fl.CallInfo, headers: dict[str, list[str]]) -> None:
        values = headers.get("authorization") or []
        if not bearer_ok(self.token, values[0] if values else None):
            raise fl.FlightUnauthenticatedError("missing or wrong bearer token")


class _Params(fl.ServerMiddleware):  # type: ignore[misc]
    def __init__(self, params: dict[str, str]) -> None:
        super().__init__()
        self.params = params


class _ParamsFactory(fl.ServerMiddlewareFactory):  # type: ignore[misc]
    """Notes a call's query parameters from its headers: the node it was forwarded by (for
    `forward`'s hop guard) and the shard it is restricted to."""

    _HEADERS = ((FORWARDED_BY_HEADER, FORWARDED_BY), (SHARD_HEADER, SHARD))

    def start_call(self, info: fl.CallInfo, headers: dict[str, list[str]]) -> _Params:
        return _Params({param: str(headers[h][0]) for h, param in self._HEADERS if headers.get(h)})


def _flight_error(exc: QueryError) -> fl.FlightError:
    """``exc`` as a Flight-kind error: pyarrow attaches the server's traceback (its frames and
    file paths) to any other exception it sends, ``ArrowInvalid`` included."""
    if isinstance(exc, QueryRefusedError):
        return fl.FlightUnauthorizedError(str(exc))
    if isinstance(exc, QueryTimeoutError):
        return fl.FlightTimedOutError(str(exc))
    # Flight has no INVALID_ARGUMENT kind: the error's kind goes in the extra info instead.
    return fl.FlightServerError(str(exc), exc.kind.encode())


PutHandler = Callable[[list[str], pa.Table], Reply]
"""Takes a ``do_put``: the descriptor's path and the rows sent; answers as an HTTP route
would (JSON with a ``message``): 200 goes back as the put's metadata, an error status as
the Flight error of its kind (see ``FlightQueryServer``)."""


def _put_error(reply: Reply) -> fl.FlightError:
    """A put's error answer as a Flight-kind error, its JSON as the extra info."""
    try:
        message = str(json.loads(reply.body).get("message", reply.status))
    except (ValueError, AttributeError):
        message = f"status {reply.status}"
    if reply.status in (421, 429, 503):
        return fl.FlightUnavailableError(message, reply.body)
    if reply.status == 504:
        return fl.FlightTimedOutError(message, reply.body)
    return fl.FlightServerError(message, reply.body)


class FlightQueryServer(fl.FlightServerBase):  # type: ignore[misc]
    """Serves ``engine`` on grpc://host:port, or grpc+tls://host:port with ``tls``; port 0
    picks a free port (see ``port``).

    ``do_get``: the ticket is UTF-8 SQL; the result, held to the engine's limits (rows,
    bytes, memory, timeout) before it is sent, streams as Arrow. Errors: refused ->
    unauthorized, timeout -> timed out, any other query error (bad SQL, a row, byte or memory
    limit) -> a server error (``fl.FlightServerError``) with the engine's message first and
    the error's kind (``query_error``, ``row_limit``, ``result_too_large``,
    ``memory_limit``) as its extra info; a wrong or missing token when ``token`` is set ->
    unauthenticated. A ticket is only SQL: its parameters come from the call's headers,
    ``FORWARDED_BY`` (the node named by ``FORWARDED_BY_HEADER``) and ``SHARD`` (from
    ``SHARD_HEADER``: the query reads only that shard's tables). ``forward`` may answer a
    query elsewhere first; if it fails, the client gets an unavailable error naming why.
    A ticket that is not UTF-8 gets a server error saying so; over
    ``limits.max_concurrent_queries`` running queries, an unavailable error at once. Every
    error sent is of a Flight kind, so none carries the server's traceback (nor does the
    unknown table of ``get_flight_info``).
    ``do_put`` (with ``put``): a path descriptor names the target; the rows, at most
    ``limits.max_request_bytes`` of them (past it a server error, ``too_large``, and the
    rest is not read), go to ``put``, whose answer comes back as the put's one metadata
    message (200) or as an error: 421, 429, 503 -> unavailable, 504 -> timed out, any other
    -> a server error; each carries the answer's JSON as its extra info.
    ``observe`` hears of every query answered
    (protocol ``flight``, result, seconds until the result is ready to stream). It serves
    from construction until ``shutdown()``.
    Do not call ``serve()`` in a process that handles signals: it only waits, and while it
    waits Arrow's own SIGINT/SIGTERM handler replaces the process's; with a second Flight
    server in the process (a flush handoff) that handler ends up acting for neither, and
    SIGTERM is lost.
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
        observe: QueryObserver | None = None,
        put: PutHandler | None = None,
    ) -> None:
        self._observe = observe
        self._put = put
        self._auth = _BearerFactory(token)
        self._scheme = "grpc" if tls is None else "grpc+tls"
        super().__init__(
            f"{self._scheme}://{host}:{port}",
            tls_certificates=[] if tls is None else [fl.CertKeyPair(*tls.pem())],
            middleware={"auth": self._auth, "params": _ParamsFactory()},
        )
        self.engine = engine
        self.host = host
        self._forward = forward
        self._cap = (limits or ServerLimits()).max_concurrent_queries
        self._max_put_bytes = (limits or ServerLimits()).max_request_bytes
        self._queries = threading.BoundedSemaphore(self._cap)

    def reconfigure(self, token: str | None) -> None:
        """Take a new token from the next call on."""
        self._auth.token = token

    @property
    def location(self) -> str:
        """The URL clients connect to."""
        return f"{self._scheme}://{self.host}:{self.port}"

    def do_get(self, context: fl.ServerCallContext, ticket: fl.Ticket) -> fl.RecordBatchStream:
        try:
            sql = ticket.ticket.decode()
        except UnicodeDecodeError as exc:
            raise fl.FlightServerError(f"the ticket is not UTF-8 SQL: {exc.reason}") from None
        with observed(self._observe, "flight") as outcome:
            if not self._queries.acquire(blocking=False):
                outcome.result = "too_many_queries"
                raise fl.FlightUnavailableError(f"{self._cap} queries running; retry later")
            params = context.get_middleware("params").params
            try:
                return self._answer(sql, params, outcome)
            finally:
                self._queries.release()

    def _answer(
        self, sql: str, params: Mapping[str, str], outcome: Outcome
    ) -> fl.RecordBatchStream:
        try:
            forwarded = self._forward(sql, params) if self._forward is not None else None
        except Exception as exc:  # the place it forwards to is unreachable or refused it
            outcome.result = "forward_failed"
            why = f"forward failed: {type(exc).__name__}: {exc}"
            raise fl.FlightUnavailableError(why) from None
        if forwarded is not None:
            return fl.RecordBatchStream(forwarded)
        try:
            table = self.engine.query(sql, shard_of(params))
        except QueryError as exc:
            outcome.result = exc.kind
            raise _flight_error(exc) from None
        return fl.RecordBatchStream(table)

    def do_put(
        self,
        context: fl.ServerCallContext,
        descriptor: fl.FlightDescriptor,
        reader: fl.MetadataRecordBatchReader,
        writer: fl.FlightMetadataWriter,
    ) -> None:
        if self._put is None:
            raise fl.FlightServerError("this server takes no puts", b"not_supported")
        if descriptor.descriptor_type != fl.DescriptorType.PATH:
            raise fl.FlightServerError(
                "name the put's target with a path descriptor", b"bad_request"
            )
        batches, size = [], 0
        for chunk in reader:
            if chunk.data is None:
                continue
            size += chunk.data.nbytes
            if size > self._max_put_bytes:
                raise fl.FlightServerError(
                    f"more than {self._max_put_bytes} bytes in one put (server.max_request_bytes)",
                    b"too_large",
                )
            batches.append(chunk.data)
        path = [part.decode("utf-8", "replace") for part in descriptor.path]
        reply = self._put(path, pa.Table.from_batches(batches, schema=reader.schema))
        if reply.status != 200:
            raise _put_error(reply)
        writer.write(pa.py_buffer(reply.body))

    def _info(self, view: TableView) -> fl.FlightInfo:
        endpoint = fl.FlightEndpoint(f'SELECT * FROM "{view.name}"', [self.location])
        return fl.FlightInfo(
            view.schema, fl.FlightDescriptor.for_path(view.name), [endpoint], view.rows, view.nbytes
        )

    def list_flights(
        self, context: fl.ServerCallContext, criteria: bytes
    ) -> Iterator[fl.FlightInfo]:
        """One FlightInfo per table name (every shard held): path descriptor = name, schema,
        row and byte counts."""
        for view in self.engine.catalog.views():
            yield self._info(view)

    def get_flight_info(
        self, context: fl.ServerCallContext, descriptor: fl.FlightDescriptor
    ) -> fl.FlightInfo:
        """The FlightInfo of the table named by a path descriptor."""
        for view in self.engine.catalog.views():
            if descriptor.path == [view.name.encode()]:
                return self._info(view)
        raise fl.FlightServerError(f"no table {descriptor.path!r}", b"not_found")
