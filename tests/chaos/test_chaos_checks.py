"""The chaos run's end checks flag what they must: doubled leaders, backward epochs, WAL damage.

Plain records and real WAL files; no services. A check that never fails would make the chaos
test pass vacuously, so each is shown failing on a constructed bad history.
"""

from __future__ import annotations

import json
from pathlib import Path

from devstack.chaos import (
    Commit,
    LeaderObservation,
    commit_violations,
    leader_violations,
    read_commits,
    repaired_corruption,
    verify_wals,
)
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
