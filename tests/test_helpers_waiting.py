"""`tests.helpers.waiting.wait_for`, the tests' one wait: what it returns on, how it fails."""

from __future__ import annotations

import itertools
import time

import pytest

from devstack.process import DevstackError
from tests.helpers.waiting import wait_for


def test_returns_once_the_check_holds_asking_every_interval() -> None:
    calls = itertools.count(1)
    began = time.monotonic()
    wait_for(lambda: next(calls) == 3, 5, "the third call", interval=0.05)
    assert next(calls) == 4
    assert 0.1 <= time.monotonic() - began < 2.0


def test_fails_after_the_timeout_naming_what_and_what_it_saw() -> None:
    began = time.monotonic()
    with pytest.raises(AssertionError) as failed:
        wait_for(lambda: False, 0.3, "rows", interval=0.05, seen=lambda: {"rows": 7})
    assert str(failed.value) == "timed out after 0 s waiting for rows (seen: {'rows': 7})"
    assert time.monotonic() - began >= 0.3
    with pytest.raises(AssertionError, match=r"^timed out after 0 s waiting for rows$"):
        wait_for(lambda: False, 0.1, "rows", interval=0.05)


@pytest.mark.parametrize(
    "error", [AssertionError("code 500"), RuntimeError("refused"), DevstackError("gone")]
)
def test_an_error_in_the_check_ends_the_wait_at_once_unchanged(error: Exception) -> None:
    calls = itertools.count(1)

    def check() -> bool:
        next(calls)
        raise error

    with pytest.raises(type(error)) as failed:
        wait_for(check, 5, "rows", interval=0.05)
    assert failed.value is error
    assert next(calls) == 2  # asked once


def test_with_retry_errors_an_error_is_not_yet() -> None:
    calls = itertools.count(1)

    def check() -> bool:
        if next(calls) < 3:
            raise ConnectionRefusedError("coming back")
        return True

    wait_for(check, 5, "the service", interval=0.01, retry_errors=True)
    assert next(calls) == 4
    with pytest.raises(AssertionError, match="waiting for the service"):
        wait_for(lambda: 1 / 0 > 0, 0.1, "the service", interval=0.01, retry_errors=True)
