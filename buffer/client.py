"""Client helper for the query services."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.flight as fl

from buffer.auth import bearer_header
from buffer.formats import Format, decode_arrow


class QueryFailedError(Exception):
    """The server answered a query with an error; ``status`` is the HTTP status (None for
    Flight) and the message is the server's."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def query(url: str, sql: str, token: str | None = None, timeout_s: float = 60.0) -> pa.Table:
    """The result of ``sql`` from a buffer query server.

    ``url`` is ``grpc://host:port`` (Flight) or ``http://host:port`` (HTTP endpoint, Arrow
    format). Raises QueryFailedError with the server's message on any error answer.
    """
    scheme = urlsplit(url).scheme
    if scheme in ("grpc", "grpc+tcp"):
        return _query_flight(url, sql, token, timeout_s)
    if scheme in ("http", "https"):
        return _query_http(url, sql, token, timeout_s)
    raise ValueError(f"unsupported URL scheme {scheme!r} in {url!r}; use grpc:// or http://")


def _query_flight(url: str, sql: str, token: str | None, timeout_s: float) -> pa.Table:
    headers = [(b"authorization", bearer_header(token).encode())] if token else []
    options = fl.FlightCallOptions(headers=headers, timeout=timeout_s)
    with fl.connect(url) as client:
        try:
            return client.do_get(fl.Ticket(sql.encode()), options=options).read_all()
        except (fl.FlightError, pa.ArrowException) as exc:
            # gRPC appends ". Detail: <status>. gRPC client debug context: ..." to the message.
            raise QueryFailedError(str(exc).split(". Detail: ")[0]) from exc


def _query_http(url: str, sql: str, token: str | None, timeout_s: float) -> pa.Table:
    request = urllib.request.Request(
        url.rstrip("/") + "/query?format=arrow",
        data=sql.encode(),
        method="POST",
        headers={"Content-Type": "application/sql", "Accept": Format.ARROW.value},
    )
    if token:
        request.add_header("Authorization", bearer_header(token))
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return decode_arrow(response.read())
    except urllib.error.HTTPError as exc:
        body = exc.read()
        try:
            message = json.loads(body)["message"]
        except (ValueError, KeyError, TypeError):
            message = body.decode(errors="replace")
        raise QueryFailedError(message, exc.code) from exc
