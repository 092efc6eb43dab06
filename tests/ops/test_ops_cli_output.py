"""What the operator commands print, and the defaults of the options several of them share:
scripts parse the one and rely on the other, so both stay as they are (issue #36). The text
comes from the `describe...` functions of `hakafka.ops`; the options from `hakafka.cli`."""

from __future__ import annotations

import pytest

from hakafka.cli import build_parser
from hakafka.coordination import PendingIntent
from hakafka.ops import offsets, replace, reshard
from hakafka.ops.failover import Handover


def test_node_replace_prints_the_mark_then_where_each_shard_went() -> None:
    moved = [Handover(0, "node-a", "node-b", 7, 1.5), Handover(2, "node-a", "node-c", 3, 0.25)]
    assert replace.describe(replace.Replacement("node-a", "disk swap", moved)).splitlines() == [
        "node-a: under replacement (disk swap); it leads no shard and gets no flush from now on",
        "shard 0: node-b leads (epoch 7), took over from node-a in 1.50 s",
        "shard 2: node-c leads (epoch 3), took over from node-a in 0.25 s",
    ]
    assert replace.describe_done("node-a", cleared=True) == (
        "node-a: no longer under replacement; it stands for leadership again"
    )
    assert replace.describe_done("node-a", cleared=False) == (
        "node-a was not under replacement (nothing to do)"
    )


def test_reshard_prints_each_move_then_how_many_checkpoints_it_placed() -> None:
    moves = [reshard.Move("events", 0, 120, 0, 0), reshard.Move("events", 1, 80, 0, 2)]
    assert reshard.describe(moves, 3).splitlines() == [
        "events: partition 0 at offset 120: stays in shard 0",
        "events: partition 1 at offset 80: shard 0 -> shard 2",
        "resharded to 3 shards: 2 checkpoints placed",
    ]
    assert reshard.describe([], 2) == "resharded to 2 shards: 0 checkpoints placed"
    assert reshard.describe_abort(True) == "reshard aborted"
    assert reshard.describe_abort(False) == "no reshard in progress (nothing to do)"


def test_pending_show_prints_a_line_per_pending_block_or_that_there_is_none() -> None:
    intent = PendingIntent("b-12", {"events": {0: (100, 3100), 1: (7, 9)}}, 4)
    assert offsets.describe_pending([]) == "no block is pending"
    assert offsets.describe_pending(
        [(1, "events", intent), (2, "events", intent)]
    ).splitlines() == [
        "shard 1, pipeline events: block b-12: rows unknown (events[0] 100..3099, events[1] 7..8)",
        "shard 2, pipeline events: block b-12: rows unknown (events[0] 100..3099, events[1] 7..8)",
    ]


@pytest.mark.parametrize(
    ("argv", "wait"),
    [
        (["failover", "--shard", "0"], 60.0),
        (["node", "replace", "node-a", "--start"], 60.0),
        (["pipeline", "pause", "--pipeline", "events"], 60.0),
        (["offsets", "set", "--pipeline", "events", "--shard", "0", "--to-latest"], 60.0),
        (["pending", "drop", "--pipeline", "events", "--shard", "0"], 60.0),
        (["query", "SELECT 1"], None),  # then zookeeper.session_timeout + 2
    ],
)
def test_wait_defaults_to_a_minute_but_for_query(argv: list[str], wait: float | None) -> None:
    assert build_parser().parse_args(argv).wait == wait


def test_shard_and_pipeline_are_filters_where_optional_and_reasons_have_defaults() -> None:
    parse = build_parser().parse_args
    for argv in (
        ["offsets", "show"],
        ["pending", "show"],
        ["pipeline", "resume", "--pipeline", "p"],
    ):
        assert parse(argv).shard is None
    assert parse(["wal", "inspect"]).pipeline is None
    assert parse(["query", "SELECT 1", "--shard", "2"]).shard == 2
    assert parse(["node", "replace", "node-a", "--done"]).reason == "replacement"
    assert parse(["pipeline", "pause", "--pipeline", "p"]).reason == "no reason given"
