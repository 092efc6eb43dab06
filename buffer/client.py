"""Clients of the query services and of a node's admin endpoint.

Their requests carry the bearer token, so they never follow a redirect (a 3xx is an error
naming its Location, and the token goes nowhere else), and with a `ClientTls` they verify the
server and refuse plain-text URLs.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from email.message import Message
from typing import IO, Any
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.flight as fl

from buffer.auth import bearer_header
from buffer.formats import Format, decode_arrow
from buffer.sql import SHARD
from buffer.tls import ClientTls

FORWARDED_BY = "forwarded_by"
"""The `buffer.sql.Forward` parameter naming the node that forwarded the query here; absent
when a client sent it. The hop guard: a forwarded query is never forwarded again."""
FORWARDED_BY_HEADER = "x-hakafka-forwarded-by"
"""The Flight call header that carries `FORWARDED_BY`."""
SHARD_HEADER = "x-hakafka-shard"
"""The Flight call header that carries `SHARD` (a Flight ticket is only SQL)."""

_TLS_SCHEMES = frozenset({"https", "grpc+tls"})
_FLIGHT_SCHEMES = frozenset({"grpc", "grpc+tcp", "grpc+tls"})


class QueryFailedError(Exception):
    """The server answered a query with an error; ``status`` is the HTTP status (None for
    Flight) and the message is the server's. ``unavailable``: no server answered at all
    (connection refused or dropped), so another may."""

    def __init__(self, message: str, status: int | None = None, *, unavailable: bool = False):
        super().__init__(message)
        self.status = status
        self.unavailable = unavailable


class RedirectRefusedError(OSError):
    """A server answered with a redirect, which was not followed: the request carried the
    bearer token, which must not go to an address the server picks."""

    def __init__(self, url: str, status: int, location: str | None) -> None:
        super().__init__(
            f"{url}: answered {status} redirecting to {location or '(no Location)'}; "
            "not followed (the request carries the bearer token)"
        )
        self.status = status
        self.location = location


class PlainTextRefusedError(ValueError):
    """A client that requires TLS was given a plain-text URL."""


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(  # noqa: PLR0917 (urllib's signature)
        self,
        req: urllib.request.Request,
        fp: IO[bytes],
        code: int,
        msg: str,
        headers: Message,
        newurl: str,
    ) -> urllib.request.Request | None:
        fp.close()
        raise RedirectRefusedError(req.full_url, code, headers.get("Location"))


def open_url(request: urllib.request.Request, tls: ClientTls | None, timeout_s: float) -> Any:
    """The response to `request` (a context manager). An https server is verified against
    `tls` (the system CAs without one); with `tls`, an http URL raises PlainTextRefusedError.
    A redirect raises RedirectRefusedError; another error status raises HTTPError, a failed
    connection or handshake URLError."""
    require_tls(request.full_url, tls)
    handlers: list[urllib.request.BaseHandler] = [_NoRedirect()]
    if tls is not None:
        handlers.append(urllib.request.HTTPSHandler(context=tls.context()))
    return urllib.request.build_opener(*handlers).open(request, timeout=timeout_s)


def query(
    url: str,
    sql: str,
    token: str | None = None,
    timeout_s: float = 60.0,
    *,
    tls: ClientTls | None = None,
    forwarded_by: str | None = None,
    shard: int | None = None,
) -> pa.Table:
    """The result of ``sql`` from a buffer query server, over the tables of ``shard`` only
    when given (else over every shard the server holds).

    ``url`` is ``grpc://`` or ``grpc+tls://host:port`` (Flight) or ``http://`` or
    ``https://host:port`` (HTTP endpoint, Arrow format); TLS servers are verified against
    ``tls`` (the system CAs without one), and with ``tls`` a plain-text URL raises
    PlainTextRefusedError. ``forwarded_by`` (Flight only) names the node forwarding the
    query, so the server does not forward it again. Raises QueryFailedError with the
    server's message on any error answer.
    """
    scheme = urlsplit(url).scheme
    if scheme in _FLIGHT_SCHEMES:
        return _query_flight(
            url, sql, token, timeout_s, tls=tls, forwarded_by=forwarded_by, shard=shard
        )
    if scheme in ("http", "https") and forwarded_by is None:
        return _query_http(url, sql, token, timeout_s, tls, shard=shard)
    if scheme in ("http", "https"):
        raise ValueError(f"forwarding goes over Flight; got {url!r}")
    raise ValueError(
        f"unsupported URL scheme {scheme!r} in {url!r}; use grpc://, grpc+tls://, http:// "
        "or https://"
    )


def require_tls(url: str, tls: ClientTls | None) -> None:
    """PlainTextRefusedError if `tls` is required and `url` is not a TLS one."""
    if tls is not None and urlsplit(url).scheme not in _TLS_SCHEMES:
        raise PlainTextRefusedError(
            f"{url} is not TLS, and this client requires TLS: it would send the bearer token "
            "in clear"
        )


def _query_flight(
    url: str,
    sql: str,
    token: str | None,
    timeout_s: float,
    *,
    tls: ClientTls | None,
    forwarded_by: str | None,
    shard: int | None,
) -> pa.Table:
    require_tls(url, tls)
    headers = [(b"authorization", bearer_header(token).encode())] if token else []
    if forwarded_by is not None:
        headers.append((FORWARDED_BY_HEADER.encode(), forwarded_by.encode()))
    if shard is not None:
        headers.append((SHARD_HEADER.encode(), str(shard).encode()))
    options = fl.FlightCallOptions(headers=headers, timeout=timeout_s)
    roots = None if tls is None else tls.root_certs()
    with fl.connect(url, tls_root_certs=roots) as client:
        try:
            return client.do_get(fl.Ticket(sql.encode()), options=options).read_all()
        except (fl.FlightError, pa.ArrowException) as exc:
            # gRPC appends ". Detail: <status>. gRPC client debug context: ..." to the message.
            raise QueryFailedError(
                str(exc).split(". Detail: ")[0],
                unavailable=isinstance(exc, fl.FlightUnavailableError),
            ) from exc


def _query_http(
    url: str,
    sql: str,
    token: str | None,
    timeout_s: float,
    tls: ClientTls | None,
    *,
    shard: int | None,
) -> pa.Table:
    only = "" if shard is None else f"&{SHARD}={shard}"
    request = urllib.request.Request(
        url.rstrip("/") + "/query?format=arrow" + only,
        data=sql.encode(),
        method="POST",
        headers={"Content-Type": "application/sql", "Accept": Format.ARROW.value},
    )
    if token:
        request.add_header("Authorization", bearer_header(token))
    try:
        with open_url(request, tls, timeout_s) as response:
            return decode_arrow(response.read())
    except RedirectRefusedError as exc:
        raise QueryFailedError(str(exc), exc.status) from None
    except urllib.error.HTTPError as exc:
        body = exc.read()
        try:
            message = json.loads(body)["message"]
        except (ValueError, KeyError, TypeError):
            message = body.decode(errors="replace")
        raise QueryFailedError(message, exc.code) from exc
