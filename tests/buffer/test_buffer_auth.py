"""The HTTP server's token check: bearer for clients, HTTP Basic (token as password) for a
browser, and a 401 that offers both so a browser asks its user."""

from __future__ import annotations

import base64
import urllib.error
import urllib.request

import pytest

from buffer import Catalog, QueryLimits, SqlEngine
from buffer.auth import bearer_ok, http_token_ok
from buffer.http import HttpQueryServer, Route

TOKEN = "s3cret-token"


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


@pytest.mark.parametrize(
    ("authorization", "ok"),
    [
        (f"Bearer {TOKEN}", True),
        (f"bearer {TOKEN}", True),
        (basic("admin", TOKEN), True),
        (basic("", TOKEN), True),
        (basic("anyone-else", TOKEN), True),
        ("Basic " + base64.b64encode(f"u:{TOKEN}:x".encode()).decode(), False),
        (basic(TOKEN, "wrong"), False),  # the token as the user name is not the password
        (basic("admin", TOKEN + "x"), False),
        (basic("admin", ""), False),
        ("Basic " + base64.b64encode(TOKEN.encode()).decode(), False),  # no colon
        ("Basic not*base64!", False),
        ("Basic ", False),
        ("Bearer wrong", False),
        (f"Digest {TOKEN}", False),
        (TOKEN, False),
        ("", False),
        (None, False),
    ],
)
def test_http_token_ok(authorization: str | None, ok: bool) -> None:
    assert http_token_ok(TOKEN, authorization) is ok


def test_no_token_configured_lets_everything_in() -> None:
    assert http_token_ok(None, None)
    assert http_token_ok(None, basic("a", "b"))


def test_flight_keeps_to_the_bearer_scheme() -> None:
    assert not bearer_ok(TOKEN, basic("admin", TOKEN))


def get(url: str, authorization: str | None) -> tuple[int, list[str], bytes]:
    """Status, WWW-Authenticate headers and body of a GET."""
    request = urllib.request.Request(url)
    if authorization is not None:
        request.add_header("Authorization", authorization)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.headers.get_all("WWW-Authenticate") or [], b""
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get_all("WWW-Authenticate") or [], exc.read()


def test_private_routes_take_basic_credentials_and_401_offers_basic() -> None:
    engine = SqlEngine(Catalog(), QueryLimits())
    page = Route(lambda: (200, "text/html", b"<html></html>"))
    server = HttpQueryServer(engine, token=TOKEN, routes={"/": page})
    server.start()
    try:
        for path in ("/", "/query?sql=SELECT%201"):
            status, challenges, body = get(server.url + path, None)
            assert status == 401, path
            assert challenges == ["Bearer", 'Basic realm="hakafka"'], path
            assert b"missing or wrong bearer token" in body
            assert get(server.url + path, basic("admin", "nope"))[0] == 401, path
            assert get(server.url + path, basic("admin", TOKEN))[0] == 200, path
            assert get(server.url + path, f"Bearer {TOKEN}")[0] == 200, path
    finally:
        server.close()
        engine.close()
