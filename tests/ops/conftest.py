"""Fixture for the operator tests: the `hakafka` command run as a separate process (its exit
code is what scripts see). Clusters come from tests/conftest.py (`make_cluster`)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests import commands


@pytest.fixture
def hakafka() -> Callable[..., commands.Run]:
    """Runs `hakafka ARGS...` as a child process; returns its exit code and output."""
    return commands.hakafka
