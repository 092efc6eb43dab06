"""Fixture for the operator tests: the `hakafka` command run as a separate process (its exit
code is what scripts see). Clusters come from tests/conftest.py (`make_cluster`)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass

import pytest


@dataclass(frozen=True)
class Run:
    code: int
    out: str
    err: str
    raw: bytes  # stdout as written (for --format arrow)


def _hakafka(*args: str, timeout: float = 120.0) -> Run:
    done = subprocess.run(
        [sys.executable, "-m", "hakafka.cli", *args],
        capture_output=True,
        timeout=timeout,
        check=False,
    )
    return Run(
        done.returncode,
        done.stdout.decode(errors="replace"),
        done.stderr.decode(errors="replace"),
        done.stdout,
    )


@pytest.fixture
def hakafka() -> Callable[..., Run]:
    """Runs `hakafka ARGS...` as a child process; returns its exit code and output."""
    return _hakafka
