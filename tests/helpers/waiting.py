"""Waiting for a condition in a test: `devstack.process.wait_until`, the project's one
polling loop, failing the way a test fails."""

from __future__ import annotations

from collections.abc import Callable

from devstack.process import DevstackError, wait_until


def wait_for(
    check: Callable[[], object],
    timeout: float,
    what: str,
    interval: float = 0.5,
    *,
    seen: Callable[[], object] | None = None,
    retry_errors: bool = False,
) -> None:
    """Return once `check()` is true, asking it every `interval` s.

    After `timeout` s it raises AssertionError "timed out after N s waiting for `what`",
    followed by " (seen: ...)" with what `seen()` reads at that moment if `seen` is given.
    An exception raised by `check` (a failed request, an assertion inside it) ends the wait
    at once and propagates unchanged; with `retry_errors` it counts as "not yet" instead,
    for services that refuse a request or two while they come back."""
    raised: list[Exception] = []

    def ready() -> bool:
        # wait_until would take an exception for "not ready yet": keep it to raise it here.
        try:
            return bool(check())
        except Exception as exc:
            if retry_errors:
                return False
            raised.append(exc)
            return True  # ends the wait

    try:
        wait_until(ready, timeout=timeout, what=what, interval=interval)
    except DevstackError:
        at_end = f" (seen: {seen()!r})" if seen is not None else ""
        raise AssertionError(
            f"timed out after {timeout:.0f} s waiting for {what}{at_end}"
        ) from None
    if raised:
        raise raised[0]
