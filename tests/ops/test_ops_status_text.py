"""What `hakafka status` prints: a pipeline's STATE column, operator state with deadlines."""

from __future__ import annotations

import time

from hakafka.ops.status import render, state_text


def test_state_names_a_pending_reflush_and_an_error() -> None:
    assert state_text({"state": "consuming"}) == "consuming"
    reflushing = {"state": "consuming", "reflushing": True, "pending_block": "9f2c"}
    assert state_text(reflushing) == "consuming, re-flushing pending 9f2c"
    failing = {**reflushing, "error": "flush failing: ConnectionError: refused"}
    assert state_text(failing) == (
        "consuming, re-flushing pending 9f2c: flush failing: ConnectionError: refused"
    )


def test_operator_state_with_a_deadline_says_when_it_ends_by_itself() -> None:
    now = time.time()
    paused = {"by": "ops@h", "at": now - 5, "reason": "offsets set --to-latest by ops@h"}
    status = {
        "shards": [
            {"shard": 0, "leader": "n1", "epoch": 3, "since": now, "status": "consuming",
             "paused": ["events"]},
        ],
        "pipelines": [
            {"shard": 0, "node": "n1", "pipeline": "events", "state": "paused", "error": None,
             "paused": {**paused, "deadline": now + 65}},
        ],
        "nodes": [],
        "reshard": {"by": "ops@h", "at": now - 30, "shard_count": 3, "deadline": now + 270,
                    "settings_version": 4},
    }  # fmt: skip
    text = render(status)
    (shard,) = [line for line in text.splitlines() if line.split()[:2] == ["0", "n1"]]
    assert "consuming, events paused" in shard
    lines = text.splitlines()
    reshard = lines[lines.index(shard) + 1]
    assert reshard.startswith("reshard to 3 shards in progress, by ops@h since ")
    assert "leaders drain; they abort it at " in reshard and "(in 270s)" in reshard
    assert reshard.endswith("unless it completes (`hakafka reshard --abort` ends it now)")
    (row,) = [line for line in lines if line.split()[:2] == ["0", "events"]]
    assert "paused by ops@h since " in row and "(5s ago): offsets set --to-latest by ops@h" in row
    assert row.endswith("; the leader resumes it at " + row.split("resumes it at ")[1])
    assert "(in 65s) unless that ends it first" in row
