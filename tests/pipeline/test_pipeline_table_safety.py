"""A table that cannot take the pipeline's blocks safely fails the pipeline with the reason,
instead of being retried in the flush lane as if ClickHouse were away (in-memory parts)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from chlib.replicas import Replica
from chlib.tables import SchemaMismatchError, UnsafeTableError
from hakafka.pipeline import PipelineLeader, PipelineState
from tests.pipeline.fakes import FakeSink, one_partition, start, wait_for

UNSAFE = UnsafeTableError(
    "db.events",
    [
        "non_replicated_deduplication_window = 0 (the server's default) deduplicates nothing; "
        "fix: ALTER TABLE `db`.`events` MODIFY SETTING non_replicated_deduplication_window = 10"
    ],
)
MISMATCH = SchemaMismatchError("db.events", ["_offset"], [], [])


@dataclass
class RefusingSink(FakeSink):
    """A sink whose tables exist but are refused; `tables_ensured` counts the attempts."""

    refusal: Exception = UNSAFE

    def ensure_tables(self, replicas: tuple[Replica, ...]) -> None:
        with self.lock:
            self.tables_ensured += 1
        raise self.refusal


@pytest.mark.parametrize("refusal", [UNSAFE, MISMATCH], ids=["unsafe", "schema"])
def test_a_refused_table_fails_the_pipeline_with_its_fix_and_flushes_nothing(
    tmp_path: Path,
    leaders: list[PipelineLeader],
    monkeypatch: pytest.MonkeyPatch,
    refusal: Exception,
) -> None:
    # Short backoff: were the refusal retried, the attempts would pile up within the wait.
    monkeypatch.setattr("hakafka.pipeline.flush.BACKOFF_INITIAL_S", 0.01)
    _topic, h = one_partition(tmp_path, 40)
    h.sink = RefusingSink(refusal=refusal)
    leader = start(h, leaders)
    wait_for(lambda: not leader.running, "the pipeline to fail on the refused table")
    assert leader.status.state is PipelineState.FAILED
    assert leader.status.error == f"{type(refusal).__name__}: {refusal}"
    # The shard restarts it after its delay: a table fixed meanwhile is then accepted.
    assert leader.status.restartable is True
    assert h.sink.tables_ensured == 1
    assert h.sink.attempts == 0 and h.fenced.commits == 0 and h.fenced.pending is None
