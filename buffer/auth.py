"""Bearer-token check shared by the Flight and HTTP query servers."""

from __future__ import annotations

import hmac


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


def bearer_header(token: str) -> str:
    """The Authorization header value that carries ``token``."""
    return f"Bearer {token}"
