"""Fixtures of the pipeline tests (in-memory parts: tests/pipeline/fakes.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from hakafka.pipeline import PipelineLeader


@pytest.fixture
def leaders() -> Iterator[list[PipelineLeader]]:
    """Leaders a test started; each is stopped at the end, also when the test fails."""
    started: list[PipelineLeader] = []
    yield started
    for leader in started:
        leader.stop(0.0)
