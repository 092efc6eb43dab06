"""Fixtures of the devstack tests, which start whole stacks of their own under tmp_path."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from devstack.process import processes_under, stop_pid


@pytest.fixture
def reap(tmp_path: Path) -> Iterator[None]:
    """Stop, by PID, whatever a failing test left running under its tmp_path."""
    yield
    for pid in processes_under(tmp_path):
        stop_pid(pid, marker=str(tmp_path))
