"""The chaos run's end checks flag what they must: doubled leaders, backward epochs, WAL damage,
slow leader changes, re-flushes off their recorded plan; and the pieces the run is built from:
per-node rows_per_task, a cluster's configs for a new shard layout, the reshard's place in
the fault schedule.

Plain records, small synthetic JSON logs and real WAL files; no services. A check that never
fails would make the chaos test pass vacuously, so each is shown failing on a constructed bad
history.
"""

from __future__ import annotations

import json
import time
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from devstack.chaos.checks import (
    NODE_STARTING,
    Commit,
    ElectionTiming,
    checkpoint_summary,
    commit_violations,
    configured_rows_per_task,
    consuming_bound,
    consuming_summary,
    election_timings,
    flush_report,
    log_events,
    log_files,
    mark_start,
    planned_tasks,
    read_commits,
    repaired_corruption,
    too_slow,
    verify_wals,
)
from devstack.chaos.driver import ChaosDriver, ChaosTargets, Fault, ReshardAttempt, ReshardPlan
from devstack.chaos.liveness import LivenessMonitor, LivenessSample, recoveries
from devstack.chaos.watcher import LeaderObservation, leader_violations
from devstack.cluster import LocalCluster, PipelineSpec, StackEndpoints, render_config
from hakafka.config import load_config
from wal import WriteAheadLog
from wal.segment import segment_name


def seen(at: float, shard: int, node: str | None, epoch: int | None) -> LeaderObservation:
    return LeaderObservation(at, shard, node, epoch, None if node is None else "elected")


def test_leader_history_with_growing_epochs_and_gaps_is_clean() -> None:
    history = [
        seen(1, 0, "n1", 1),
        seen(2, 0, "n1", 1),  # status change, same holder
        seen(3, 0, None, None),
        seen(4, 0, "n2", 2),
        seen(4, 1, "n3", 1),  # shards are independent
        seen(5, 0, "n1", 4),  # epochs may skip (a change between two reads)
    ]
    assert leader_violations(history) == []


def test_leader_epoch_reused_by_another_node_or_going_back_is_flagged() -> None:
    doubled = leader_violations([seen(1, 0, "n1", 3), seen(2, 0, "n2", 3)])
    assert doubled == ["shard 0: epoch 3 held by n1 and then by n2 (at 2.000)"]
    backwards = leader_violations(
        [seen(1, 1, "n1", 5), seen(2, 1, None, None), seen(3, 1, "n3", 4)]
    )
    assert backwards == ["shard 1: epoch went back from 5 (n1) to 4 (n3) at 3.000"]


def commit(at: float, node: str, shard: int, epoch: int) -> Commit:
    return Commit(at, node, shard, "events", epoch)


def test_commits_one_node_per_epoch_in_order_are_clean() -> None:
    commits = [commit(1, "n1", 0, 1), commit(2, "n1", 0, 1), commit(3, "n2", 0, 2)]
    assert commit_violations(commits, [seen(0.5, 0, "n1", 1), seen(2.5, 0, "n2", 2)]) == []


def test_two_nodes_committing_one_epoch_or_an_old_epoch_later_are_flagged() -> None:
    problems = commit_violations(
        [commit(1, "n1", 0, 2), commit(2, "n2", 0, 2), commit(3, "n1", 0, 1)],
        [seen(0.5, 0, "n1", 2)],
    )
    assert problems == [
        "shard 0 epoch 2: checkpoints committed by n1 and n2",
        "shard 0 epoch 2: n2 committed but the leader znode named n1",
        "shard 0 events: n1 committed epoch 1 after n2 committed epoch 2",
    ]


def test_commits_and_repairs_are_read_from_the_json_logs(tmp_path: Path) -> None:
    lines = [
        {"event": "leader.elected", "shard": 0, "epoch": 1, "timestamp": "2026-01-01T00:00:00Z"},
        {
            "event": "fenced.checkpoint_committed",
            "shard": 0,
            "pipeline": "events",
            "epoch": 1,
            "timestamp": "2026-01-01T00:00:02.5Z",
        },
        {
            "event": "wal.repaired",
            "directory": "/d/wal/0/events",
            "report": "RepairReport(records=3, torn_tail=TornTail(...), corruption=None)",
        },
        {
            "event": "wal.repaired",
            "directory": "/d/wal/1/events",
            "report": "RepairReport(records=3, torn_tail=None, corruption=Corruption(...))",
        },
    ]
    log = tmp_path / "n1.log"
    log.write_text("not json\n" + "".join(json.dumps(line) + "\n" for line in lines))
    assert read_commits({"n1": log}) == [commit(1767225602.5, "n1", 0, 1)]
    assert repaired_corruption({"n1": log}) == [
        "n1: /d/wal/1/events: RepairReport(records=3, torn_tail=None, corruption=Corruption(...))"
    ]


def _wal(data_dir: Path, shard: int) -> Path:
    directory = data_dir / "wal" / str(shard) / "events"
    with WriteAheadLog.open(directory) as log:
        for i in range(3):
            log.append(b'{"seq": %d}' % i, b"x" * 500)
    return directory / segment_name(0)


def test_torn_tail_is_reported_but_corruption_and_quarantine_are_damage(tmp_path: Path) -> None:
    clean, torn, corrupt = (tmp_path / n for n in ("n1", "n2", "n3"))
    _wal(clean, 0)
    segment = _wal(torn, 0)
    with open(segment, "r+b") as f:
        f.truncate(segment.stat().st_size - 10)
    segment = _wal(corrupt, 1)
    data = bytearray(segment.read_bytes())
    data[600] ^= 0xFF
    segment.write_bytes(bytes(data))
    (segment.parent / f"{segment.name}.at-0.corrupt").write_bytes(b"old")

    checks = {c.directory.parts[-4]: c for c in verify_wals([clean, torn, corrupt])}
    assert sorted(checks) == ["n1", "n2", "n3"]
    assert (checks["n1"].exit_code, checks["n1"].torn_tail, checks["n1"].damaged) == (
        0,
        False,
        False,
    )
    assert (checks["n2"].torn_tail, checks["n2"].damaged) == (True, False)
    assert checks["n3"].damaged and "CORRUPT" in checks["n3"].output
    assert checks["n3"].quarantined == (f"{segment.name}.at-0.corrupt",)


# -- election -> consuming ----------------------------------------------------------------------

T0 = 1767225600.0  # 2026-01-01T00:00:00Z


def line(event: str, t: float, **fields: Any) -> str:
    """One daemon log line as structlog writes it, `t` seconds after T0."""
    stamp = f"2026-01-01T00:{int(t) // 60:02d}:{t % 60:09.6f}Z"
    return json.dumps({"event": event, "level": "info", "timestamp": stamp, **fields}) + "\n"


def timing(
    node: str,
    shard: int,
    epoch: int,
    elected: float,
    end: float | str,
    *,
    reported: float | None = None,
) -> ElectionTiming:
    """An election at `elected` s after T0 that consumed at `end` s (a number) or never
    consumed because of `end` (an outcome)."""
    consumed = isinstance(end, float | int)
    return ElectionTiming(
        node,
        shard,
        epoch,
        T0 + elected,
        T0 + float(end) if consumed else None,
        "consuming" if consumed else str(end),
        reported,
    )


def test_election_is_timed_to_the_next_consuming_of_that_node_and_shard(tmp_path: Path) -> None:
    n2 = tmp_path / "n2.log"
    n2.write_text(
        "Spark says hello\n"  # not JSON: skipped
        + line("election.became_leader", 9.9, shard=0, epoch=2)
        + line("leader.elected", 10.0, shard=0, epoch=2, token=1)
        + line("pipeline.consuming", 10.5, shard=0, pipeline="events")
        + line("leader.consuming", 11.25, shard=0, seconds=0.9)
        # a pipeline restarted later in the same term announces again: not a new sample
        + line("leader.consuming", 40.0, shard=0, seconds=2.0)
    )
    assert election_timings({"n2": n2}) == [timing("n2", 0, 2, 10.0, 11.25, reported=0.9)]


def test_election_to_first_checkpoint_counts_the_terms_own_first_commit(tmp_path: Path) -> None:
    n1 = tmp_path / "n1.log"
    n1.write_text(
        line("fenced.checkpoint_committed", 5.0, shard=0, epoch=1, pipeline="events")
        + line("leader.elected", 10.0, shard=0, epoch=3, token=1)
        + line("leader.consuming", 10.2, shard=0, seconds=0.1)
        + line("fenced.checkpoint_committed", 11.5, shard=0, epoch=3, pipeline="events")
        + line("fenced.checkpoint_committed", 12.5, shard=0, epoch=3, pipeline="clicks")
        + line("leader.elected", 20.0, shard=1, epoch=4, token=2)
        + line("leader.lost", 21.0, shard=1, reason="zookeeper session lost")
    )
    timings = election_timings({"n1": n1})
    assert [(t.shard, t.to_checkpoint) for t in timings] == [(0, 1.5), (1, None)]
    assert checkpoint_summary(timings) == (
        "election -> first checkpoint: 1 terms, min 1.50 s, median 1.50 s, p90 1.50 s, "
        "p99 1.50 s, max 1.50 s (n1 shard 0 epoch 3); without one: 1"
    )


def test_elections_that_end_before_consuming_are_not_samples(tmp_path: Path) -> None:
    n3 = tmp_path / "n3.log"
    n3.write_text(
        line("leader.elected", 1.0, shard=1, epoch=3, token=2)
        + line("leader.lost", 2.0, shard=1, reason="zookeeper session lost")
        + line("leader.consuming", 2.5, shard=1, seconds=1.4)  # too late: the term is over
        + line("leader.elected", 5.0, shard=1, epoch=5, token=4)
        + line("leader.handed_over", 6.0, shard=1, to=None, seconds=0.2)
        + line("leader.elected", 7.0, shard=1, epoch=7, token=6)
        + line("leader.recovery_failed", 8.0, shard=1, seconds=1.0, errors={})
        + line("leader.consuming", 12.0, shard=1, seconds=1.0)  # after a pipeline restart
        + line("leader.elected", 20.0, shard=1, epoch=9, token=8)
        + line("leader.elected", 30.0, shard=1, epoch=11, token=10)  # no loss line between
        + line("leader.consuming", 31.0, shard=1, seconds=0.5)
        + line("leader.elected", 40.0, shard=1, epoch=13, token=12)
        + line("daemon.stopping", 41.0)
        + line("leader.elected", 50.0, shard=1, epoch=15, token=14)  # the log ends here
    )
    assert election_timings({"n3": n3}) == [
        timing("n3", 1, 3, 1.0, "lost"),
        timing("n3", 1, 5, 5.0, "handed over"),
        timing("n3", 1, 7, 7.0, "recovery failed"),
        timing("n3", 1, 9, 20.0, "elected again"),
        timing("n3", 1, 11, 30.0, 31.0, reported=0.5),
        timing("n3", 1, 13, 40.0, "daemon stopped"),
        timing("n3", 1, 15, 50.0, "log ended"),
    ]


def test_a_restart_of_the_node_ends_its_open_elections_and_rotated_logs_are_read(
    tmp_path: Path,
) -> None:
    """n1 leads shard 0 (epoch 4) and is SIGKILLed before consuming: the process leaves no
    line, the driver's start marker ends that election; the new process wins epoch 6. The
    first process's lines were rotated to `n1.log.1` (older still: `n1.log.2`)."""
    (tmp_path / "n1.log.2").write_text(line("leader.elected", 1.0, shard=0, epoch=1, token=0))
    (tmp_path / "n1.log.1").write_text(
        line("leader.consuming", 1.5, shard=0, seconds=0.4)
        + line("leader.lost", 3.0, shard=0, reason="resigned")
        + line("leader.elected", 20.0, shard=0, epoch=4, token=3)
    )
    (tmp_path / "n1.log.gz").write_text("not a rotation we read\n")
    current = tmp_path / "n1.log"
    current.write_text(
        line(NODE_STARTING, 21.0, node="n1")
        + line("leader.elected", 25.0, shard=0, epoch=6, token=5)
        + line("daemon.started", 25.1, node="n1")
        + line("leader.consuming", 27.5, shard=0, seconds=2.1)
    )
    files = log_files(current)
    assert files == [tmp_path / "n1.log.2", tmp_path / "n1.log.1", current]
    assert election_timings({"n1": files}) == [
        timing("n1", 0, 1, 1.0, 1.5, reported=0.4),
        timing("n1", 0, 4, 20.0, "daemon restarted"),
        timing("n1", 0, 6, 25.0, 27.5, reported=2.1),
    ]
    # Without the rotated files the first election would be missing.
    assert [t.epoch for t in election_timings({"n1": current})] == [6]


def test_two_shards_of_one_node_and_two_nodes_are_matched_apart(tmp_path: Path) -> None:
    n1, n2 = tmp_path / "n1.log", tmp_path / "n2.log"
    n1.write_text(
        line("leader.elected", 1.0, shard=0, epoch=1, token=0)
        + line("leader.elected", 1.2, shard=1, epoch=1, token=0)
        + line("leader.consuming", 2.0, shard=1, seconds=0.7)  # shard 1 first
        + line("leader.lost", 2.5, shard=1, reason="resigned")  # does not touch shard 0
        + line("leader.consuming", 4.0, shard=0, seconds=2.9)
        + line("leader.lost", 9.0, shard=0, reason="zookeeper session lost")
    )
    n2.write_text(
        line("leader.elected", 3.0, shard=1, epoch=2, token=1)
        + line("leader.elected", 9.5, shard=0, epoch=2, token=1)
        + line("leader.consuming", 10.0, shard=1, seconds=0.1)  # slow: 7 s after its election
        + line("leader.consuming", 9.8, shard=0, seconds=0.2)  # written late, stamped early
    )
    timings = election_timings({"n1": n1, "n2": n2})
    assert timings == [
        timing("n1", 0, 1, 1.0, 4.0, reported=2.9),
        timing("n1", 1, 1, 1.2, 2.0, reported=0.7),
        timing("n2", 1, 2, 3.0, 10.0, reported=0.1),
        timing("n2", 0, 2, 9.5, 9.8, reported=0.2),
    ]
    assert [round(t.seconds or 0.0, 3) for t in timings] == [3.0, 0.8, 7.0, 0.3]


def test_the_distribution_line_and_the_bound() -> None:
    samples = [timing("n1", 0, e, 10.0 * e, 10.0 * e + e / 2) for e in range(1, 11)]
    never = [
        timing("n2", 1, 20, 300.0, "lost"),
        timing("n3", 1, 21, 310.0, "lost"),
        timing("n2", 0, 22, 320.0, "handed over"),
    ]
    timings = samples + never
    assert consuming_summary(timings, 8.0) == (
        "election -> consuming: 10 changes, min 0.50 s, median 2.75 s, p90 4.50 s, "
        "p99 5.00 s, max 5.00 s (n1 shard 0 epoch 10); over 8.0 s: 0; "
        "never consumed: 3 (1 handed over, 2 lost)"
    )
    assert too_slow(timings, 8.0) is None
    assert consuming_summary(timings, 4.0).endswith(
        "over 4.0 s: 2; never consumed: 3 (1 handed over, 2 lost)"
    )
    assert too_slow(timings, 4.0) == (
        "slowest leader change n1 shard 0 epoch 10: 5.00 s from leader.elected to "
        "leader.consuming, over the bound of 4.0 s (session timeout + 5 s); 2 over; "
        "also over: ['n1 shard 0 epoch 9: 4.50 s']"
    )
    reported = timing("n2", 1, 7, 0.0, 9.25, reported=8.5)
    assert too_slow([reported], 8.0) == (
        "slowest leader change n2 shard 1 epoch 7: 9.25 s, its pipelines 8.50 s from "
        "leader.elected to leader.consuming, over the bound of 8.0 s (session timeout + 5 s); "
        "1 over"
    )
    assert consuming_summary(never[:1], 8.0) == (
        "election -> consuming: 0 changes; never consumed: 1 (1 lost)"
    )
    assert consuming_summary([], 8.0) == "election -> consuming: 0 changes; never consumed: 0"


def test_bound_is_the_configs_session_timeout_plus_five_seconds(tmp_path: Path) -> None:
    def config(node: str, session_timeout: float) -> Path:
        path = tmp_path / f"{node}.toml"
        path.write_text(
            render_config(
                node=node,
                shards=[0],
                shard_count=1,
                data_dir=tmp_path / node,
                stack=StackEndpoints("127.0.0.1:2181", "127.0.0.1:9092", "127.0.0.1:8123"),
                zk_root="/chaos/x",
                replicas={0: {node: "127.0.0.1:8123"}},
                http_port=1,
                flight_port=2,
                pipelines=[PipelineSpec("events", "t", "t_events", {"id": "UInt64"})],
                session_timeout=session_timeout,
            )
        )
        return path

    assert consuming_bound([config("n1", 3.0), config("n2", 3.0)]) == 8.0
    assert consuming_bound([config("n1", 3.0), config("n3", 4.5)]) == 9.5


def test_the_start_marker_is_a_log_line_the_timings_read(tmp_path: Path) -> None:
    log = tmp_path / "n1.log"
    log.write_text(line("leader.elected", 1.0, shard=0, epoch=1, token=0))
    mark_start(log, "n1")
    (marker,) = log_events(log, [NODE_STARTING])
    assert marker["node"] == "n1"
    stamped = datetime.fromisoformat(marker["timestamp"].replace("Z", "+00:00")).timestamp()
    assert abs(stamped - time.time()) < 60
    assert [t.outcome for t in election_timings({"n1": log})] == ["daemon restarted"]


def test_a_cluster_gives_each_node_its_rows_per_task_and_relayouts_keep_the_rest(
    tmp_path: Path,
) -> None:
    cluster = LocalCluster(
        tmp_path,
        StackEndpoints("127.0.0.1:2181", "127.0.0.1:9092", "127.0.0.1:8123"),
        nodes={"n1": [0, 1], "n2": [0], "n3": [1]},
        shard_count=2,
        pipelines=[PipelineSpec("events", "t", "t_events", {"id": "UInt64"})],
        zk_root="/chaos/x",
        rows_per_task={"n1": 7_000, "n2": 11_000, "n3": 16_000},
    )
    paths = {name: node.config_path for name, node in cluster.nodes.items()}
    assert configured_rows_per_task(paths) == {"n1": 7_000, "n2": 11_000, "n3": 16_000}
    before = {name: load_config(path) for name, path in paths.items()}
    assert (before["n2"].shard_count, before["n2"].shards) == (2, (0,))

    texts = cluster.layout_configs({"n1": [0, 1, 2], "n2": [0, 2], "n3": [1, 2]}, 3)
    for name, text in texts.items():
        (tmp_path / f"{name}.new.toml").write_text(text)
    after = {name: load_config(tmp_path / f"{name}.new.toml") for name in texts}
    assert {name: (c.shard_count, c.shards) for name, c in after.items()} == {
        "n1": (3, (0, 1, 2)),
        "n2": (3, (0, 2)),
        "n3": (3, (1, 2)),
    }
    assert sorted(after["n3"].clickhouse.replicas[2]) == ["n1", "n2", "n3"]
    assert sorted(after["n3"].clickhouse.replicas[0]) == ["n1", "n2"]
    for name, config in after.items():  # same node otherwise: ports, data dir, rows_per_task
        was = before[name]
        assert (config.server, config.data_dir, config.spark) == (
            was.server,
            was.data_dir,
            was.spark,
        )


def test_a_per_node_rows_per_task_must_name_every_node(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"rows_per_task names no value for nodes \['n2'\]"):
        LocalCluster(
            tmp_path,
            StackEndpoints("127.0.0.1:2181", "127.0.0.1:9092", "127.0.0.1:8123"),
            nodes={"n1": [0], "n2": [0]},
            shard_count=1,
            pipelines=[],
            zk_root="/chaos/x",
            rows_per_task={"n1": 7_000},
        )


def test_planned_tasks_follow_the_block_plan() -> None:
    assert [planned_tasks(rows, 7_000) for rows in (0, 1, 7_000, 7_001, 14_001)] == [1, 1, 1, 2, 3]


def test_flush_report_finds_wide_blocks_and_reflushes_across_rows_per_task(
    tmp_path: Path,
) -> None:
    rows_per_task = {"n1": 7_000, "n2": 11_000, "n3": 16_000}
    n1, n2, n3 = (tmp_path / f"{n}.log" for n in ("n1", "n2", "n3"))
    n1.write_text(
        line("fenced.pending_written", 1.0, shard=0, pipeline="events", block="a", epoch=1)
        + line("flush.committed", 2.0, shard=0, pipeline="events", block="a", rows=15_000, tasks=3)
        + line("fenced.pending_written", 3.0, shard=0, pipeline="events", block="b", epoch=1)
        + line("fenced.pending_written", 3.5, shard=1, pipeline="events", block="c", epoch=4)
    )  # then SIGKILL: b and c stay pending
    n2.write_text(
        # abandoned (n2 lost the shard), then re-flushed by n2 again: one commit, the last
        line(
            "pending.reflush", 5.0, shard=0, pipeline="events", block="b", source="wal", rows=20_000
        )
        + line(
            "pending.reflush",
            8.0,
            shard=0,
            pipeline="events",
            block="b",
            source="kafka",
            rows=20_000,
        )
        + line("flush.committed", 9.0, shard=0, pipeline="events", block="b", rows=20_000, tasks=3)
        # an intent whose write no log shows
        + line("pending.reflush", 9.5, shard=0, pipeline="events", block="z", source="wal", rows=10)
        + line("flush.committed", 9.6, shard=0, pipeline="events", block="z", rows=10, tasks=1)
    )
    n3.write_text(  # planned c again with its own rows_per_task: 2 tasks, not n1's 3
        line(
            "pending.reflush", 6.0, shard=1, pipeline="events", block="c", source="wal", rows=20_000
        )
        + line("flush.committed", 7.0, shard=1, pipeline="events", block="c", rows=20_000, tasks=2)
    )
    report = flush_report({"n1": n1, "n2": n2, "n3": n3}, rows_per_task)

    assert [(c.node, c.block, c.tasks) for c in report.wide()] == [("n1", "a", 3), ("n2", "b", 3)]
    assert [(r.node, r.block, r.writer, r.committed_tasks) for r in report.reflushes] == [
        ("n2", "b", "n1", None),
        ("n3", "c", "n1", 2),
        ("n2", "b", "n1", 3),
        ("n2", "z", None, 1),
    ]
    assert report.off_plan() == [
        "n3 shard 1 block c (20000 rows, rows_per_task 16000) written by n1 (rows_per_task "
        "7000): committed in 2 tasks"
    ]
    assert report.summary() == (
        "blocks committed: 4, by tasks {1: 1, 2: 1, 3: 2}, with >= 3 tasks: 2, largest 20000 "
        "rows in 3; re-flushes: 4 (intent writer unknown: 1), on a node with another "
        "rows_per_task than the writer: 3, committed 2, in the writer's task count 1, where "
        "their own rows_per_task would have cut otherwise 2"
    )
    followed = [r for r in report.reflushes if r.committed_tasks == 3]
    assert [r.across and not r.off_plan for r in followed] == [True]


def test_a_reshard_attempt_says_how_it_went() -> None:
    moved = ("events: partition 2 at offset 810: shard 0 -> shard 2",)
    assert ReshardAttempt(61.5, True, moved, 23.41).describe() == (
        "t=61.5s resharded, request -> every shard consuming 23.4 s; "
        "moved: events: partition 2 at offset 810: shard 0 -> shard 2"
    )
    failed = ReshardAttempt(30.0, False, (), None, "exit 1: reshard aborted")
    assert not failed.ok
    assert failed.describe() == (
        "t=30.0s FAILED, the old layout consumes again: exit 1: reshard aborted"
    )
    stuck = ReshardAttempt(30.0, True, moved, None, "timed out waiting for leaders")
    assert not stuck.ok and "NOT every shard consuming: timed out" in stuck.describe()


class ScriptedDriver(ChaosDriver):
    """A driver whose every fault applies at once and whose reshard attempts succeed or
    fail as scripted; `log` is what happened, in order."""

    def __init__(self, reshards: list[bool]) -> None:
        targets = SimpleNamespace(
            netns=None, zk_proxies={}, cluster=SimpleNamespace(nodes={}, replica_per_node=False)
        )
        super().__init__(cast(ChaosTargets, targets), 1, session_timeout=3.0, say=lambda _: None)
        self.script = list(reshards)
        self.log: list[str] = []
        self._actions = dict.fromkeys(self._actions, self._fault)

    def _fault(self) -> tuple[str, str]:
        self.log.append("fault")
        return "-", "applied: scripted"

    def reshard(self, plan: ReshardPlan) -> ReshardAttempt:
        done = self.script.pop(0)
        attempt = ReshardAttempt(0.0, done, (), 1.0 if done else None, "" if done else "no")
        self.reshards.append(attempt)
        self.log.append(f"reshard {'ok' if done else 'failed'}")
        return attempt


PLAN = ReshardPlan(after=2, layout={}, shard_count=3, retry_after=3)


def faults(n: int) -> list[str]:
    return ["fault"] * n


def test_the_reshard_runs_between_faults_and_a_failed_one_once_more_later() -> None:
    driver = ScriptedDriver([False, True])
    driver.run(8, gap=(0.0, 0.0), deadline=time.monotonic() + 60, reshard=PLAN)
    assert driver.log == [
        *faults(2),
        "reshard failed",
        *faults(3),
        "reshard ok",
        *faults(3),
    ]


def test_a_reshard_failing_twice_is_not_tried_a_third_time() -> None:
    driver = ScriptedDriver([False, False])
    driver.run(9, gap=(0.0, 0.0), deadline=time.monotonic() + 60, reshard=PLAN)
    assert driver.log == [*faults(2), "reshard failed", *faults(3), "reshard failed", *faults(4)]
    assert [a.ok for a in driver.reshards] == [False, False]


def test_a_schedule_ending_before_the_reshard_still_reshards_at_its_end() -> None:
    driver = ScriptedDriver([True])
    driver.run(1, gap=(0.0, 0.0), deadline=time.monotonic() + 60, reshard=PLAN)
    assert driver.log == ["fault", "reshard ok"]


def test_ready_while_stuck_counts_runs_of_lying_probes() -> None:
    monitor = LivenessMonitor(cast(Any, None), list)
    lie, fine = (True, 50.0), (False, 50.0)
    # Shard 0: two lying probes at a hand-over, then one more after an honest one; shard 1:
    # three in a row.
    for shard, looks in ((0, [lie, lie, fine, lie]), (1, [fine, lie, lie, lie])):
        for i, (ready, stalled) in enumerate(looks):
            monitor.samples.append(LivenessSample(float(i), shard, stalled, ready))
    assert len(monitor.ready_while_stuck(38.0)) == 6
    assert [(s.shard, s.at) for s in monitor.ready_while_stuck(38.0, persist=3)] == [
        (1, 1.0),
        (1, 2.0),
        (1, 3.0),
    ]
    assert monitor.ready_while_stuck(60.0) == []
    # A reset (a reshard's checkpoint rewrite) at t=1.5: shard 1's probe at t=2 and t=3 have
    # been stalled 0.5 s and 1.5 s by the daemons' measure.
    assert [(s.shard, s.at) for s in monitor.ready_while_stuck(38.0, resets=[1.5])] == [
        (0, 0.0),
        (0, 1.0),
        (1, 1.0),
    ]


def _leader_view(shard: int, checkpoint: dict[str, int]) -> dict[str, Any]:
    pipeline = {"name": "events", "checkpoint": checkpoint, "lag": {"0": 5}, "buffer_rows": 5}
    return {"shards": [{"shard": shard, "role": "leader", "pipelines": [pipeline]}]}


def test_a_shard_that_hands_a_partition_over_progresses_on_the_partitions_it_keeps() -> None:
    monitor = LivenessMonitor(cast(Any, None), lambda: [1])
    ready, serving = {"n1": True}, {"n1": [1]}
    # Shard 1 consumes partitions 1 and 3; a reshard moves 3 (at 3000) away and brings 4 (at
    # 500): the shard's sum of offsets drops by 2500, yet partition 1 advances at every look.
    looks = [{"1": 1000, "3": 3000}, {"1": 1100, "4": 500}, {"1": 1200, "4": 500}]
    for t, checkpoint in enumerate(looks):
        monitor.observe(float(t * 20), {"n1": _leader_view(1, checkpoint)}, ready, serving)
    monitor.observe(60.0, {"n1": _leader_view(1, looks[-1])}, ready, serving)
    assert [s.stalled for s in monitor.samples] == [0.0, 0.0, 0.0, 20.0]
    # A partition the shard has just taken over is no progress by itself.
    monitor.observe(80.0, {"n1": _leader_view(1, {"1": 1200, "4": 500, "5": 9})}, ready, serving)
    assert monitor.samples[-1].stalled == 40.0
    assert monitor.ready_while_stuck(38.0) == [monitor.samples[-1]]


def test_a_recovery_is_slow_only_when_the_shards_were_left_alone_that_long() -> None:
    monitor = LivenessMonitor(cast(Any, None), list)
    # One shard sampled each second: stuck from t=10 until it progresses at t=25, then fine.
    for t in range(40):
        stalled = float(t - 10) if 10 <= t < 25 else 0.0
        monitor.samples.append(LivenessSample(float(t), 0, stalled, True))
    faults = [
        Fault(10.0, "kill_leader", "n1", "applied: SIGKILL", 2.0),  # ends at 12
        Fault(13.0, "failover", "-", "refused: no candidate", 0.0),  # not applied: ignored
        Fault(30.0, "stop_leader", "n2", "applied: SIGSTOP", 1.0),  # ends at 31
    ]
    first, last = recoveries(faults, 0.0, monitor, disturbances=[20.0])
    assert (first.kind, first.ended, first.took, first.alone) == ("kill_leader", 12.0, 13.0, 8.0)
    assert (last.kind, last.took, last.alone) == ("stop_leader", 0.0, None)
    # 13 s to progress: slow against a 10 s bound only if nothing else came within 10 s.
    assert not first.slow(10.0)  # the reshard at t=20 came first
    assert recoveries(faults, 0.0, monitor)[0].slow(10.0)  # nothing until t=30
    assert not recoveries(faults, 0.0, monitor)[0].slow(13.0)
    assert not last.slow(1.0)
