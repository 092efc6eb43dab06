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


def test_a_pipeline_read_with_several_lanes_gets_a_row_per_lane() -> None:
    lag = {0: 700, 1: 500, 2: 0, 3: 5}

    def lane(i: int, partitions: list[int], rows: int, rate: float) -> dict[str, object]:
        behind = sum(lag[p] for p in partitions)
        return {"lane": i, "partitions": partitions, "rows": rows, "rows_per_s": rate,
                "lag": behind}  # fmt: skip

    pipeline = {"shard": 0, "node": "n1", "pipeline": "events", "state": "consuming",
                "error": None, "lag": lag}  # fmt: skip
    status = {
        "shards": [],
        "pipelines": [
            {**pipeline, "lanes": [lane(0, [0, 2], 12_000, 1234.6), lane(1, [1, 3], 900, 0.0)]},
            {**pipeline, "shard": 1, "lanes": [lane(0, [0, 1, 2, 3], 5, 1.0)]},
        ],
        "nodes": [],
    }
    lines = render(status).splitlines()
    header = lines.index("SHARD  PIPELINE  LANE  PARTITIONS  ROWS/S  ROWS   LAG")
    # One lane has no table of its own: only shard 0's two lanes are listed.
    assert [line.split() for line in lines[header + 1 : header + 3]] == [
        ["0", "events", "0", "p0", "p2", "1,235", "12000", "700"],
        ["0", "events", "1", "p1", "p3", "0", "900", "505"],
    ]
    assert lines[header + 3] == ""
    (row,) = [line for line in lines if line.split()[:2] == ["0", "events"] and "|" in line]
    assert "1205 (p0=700 p2=0 | p1=500 p3=5)" in row


def test_a_pipeline_written_into_gets_a_row_of_pushes() -> None:
    pipeline = {"shard": 0, "node": "n1", "pipeline": "events", "state": "consuming",
                "error": None, "lag": {0: 0}, "lanes": []}  # fmt: skip
    pushed = {"rows": 120_000, "rows_per_s": 4321.5, "writers": 3, "unanswered": 2,
              "copying": 1, "awaiting_retries": 1}  # fmt: skip
    idle = {"rows": 0, "rows_per_s": 0.0, "writers": 0, "unanswered": 0, "copying": 0,
            "awaiting_retries": 0}  # fmt: skip
    status = {
        "shards": [],
        "pipelines": [{**pipeline, "pushed": pushed}, {**pipeline, "shard": 1, "pushed": idle}],
        "nodes": [],
    }
    lines = render(status).splitlines()
    header = lines.index(
        "SHARD  PIPELINE  PUSHED ROWS/S  ROWS    WRITERS  UNANSWERED  COPYING  AWAITED"
    )
    # Shard 1 has no writers: no row.
    assert lines[header + 1].split() == ["0", "events", "4,322", "120000", "3", "2", "1", "1"]
    assert header + 2 == len(lines) or lines[header + 2] == ""
