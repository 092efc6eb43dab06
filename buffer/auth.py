"""Token checks shared by the Flight and HTTP query servers."""

from __future__ import annotations

import base64
import binascii
import hmac

# What a 401 of the HTTP server offers: clients send the bearer token; a browser, which cannot
# add a header to a navigation, asks its user and sends HTTP Basic with the token as password.
HTTP_CHALLENGES = ("Bearer", 'Basic realm="hakafka"')


def bearer_ok(expected: str | None, authorization: str | None) -> bool:
    """True when no token is required, or ``authorization`` is ``Bearer <expected>``."""
    if expected is None:
        return True
    if authorization is None:
        return False
    scheme, _, given = authorization.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(
        given.strip().encode(), expected.encode()
    )


def http_token_ok(expected: str | None, authorization: str | None) -> bool:
    """True when no token is required, or ``authorization`` carries ``expected`` either as
    ``Bearer <expected>`` or as HTTP Basic credentials whose password is ``expected`` (any
    user name). Compared in constant time; a malformed header is a wrong one."""
    if expected is None or bearer_ok(expected, authorization):
        return True
    if authorization is None:
        return False
    scheme, _, encoded = authorization.partition(" ")
    if scheme.lower() != "basic":
        return False
    try:
        credentials = base64.b64decode(encoded.strip(), validate=True)
    except (binascii.Error, ValueError):
        return False
    _user, colon, password = credentials.partition(b":")
    return bool(colon) and hmac.compare_digest(password, expected.encode())


def bearer_header(token: str) -> str:
    """The Authorization header value that carries ``token``."""
    return f"Bearer {token}"
