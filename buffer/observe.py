"""How the query servers report each query they answer (a daemon counts them in its metrics)
without knowing who listens."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

QueryObserver = Callable[[str, str, float], None]
"""Called once per query with (protocol, result, seconds): `http` or `flight`; `ok` or the
error's kind (`query_error`, `timeout`, `result_too_large`, `too_many_queries`,
`forward_failed`, ...)."""


@dataclass
class Outcome:
    """What became of one query: `ok` unless the server sets an error's kind."""

    result: str = "ok"


@contextmanager
def observed(observer: QueryObserver | None, protocol: str) -> Iterator[Outcome]:
    """Time the block and report it to `observer` (if any) with the outcome the block set;
    an exception that escapes the block without setting one reports `internal_error`."""
    outcome = Outcome()
    began = time.monotonic()
    try:
        yield outcome
    except BaseException:
        if outcome.result == "ok":
            outcome.result = "internal_error"
        raise
    finally:
        if observer is not None:
            observer(protocol, outcome.result, time.monotonic() - began)
