"""ShardRunner's supervision of its pipelines, with in-memory pipeline parts and a stand-in
leadership and coordinator (no ZooKeeper): a pipeline that fails to start is replaced, not
counted healthy; during a reshard the term's pipelines drain, the shard reports it, and they
consume again when it ends."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest
from prometheus_client import CollectorRegistry

from buffer import MemoryTable
from hakafka.coordination import (
    BecameLeader,
    Coordinator,
    DrainedInfo,
    HeldBy,
    Leadership,
    LeadershipState,
    PauseRecord,
    Resumed,
    Suspended,
)
from hakafka.coordination.pause import StoredPause
from hakafka.daemon.restarts import RESTART_BACKOFF, HandoverPolicy
from hakafka.daemon.shard import ShardRunner, _Pauses
from hakafka.metrics import Metrics
from hakafka.pipeline import PipelineLeader, PipelineState
from tests.pipeline.fakes import Harness, Topic, pipeline_config, wait_for


@dataclass
class StandInLeadership:
    """The part of a Leadership the shard's supervision reads."""

    state: LeadershipState = LeadershipState.LEADER
    status: str = "elected"
    epoch: int = 1
    token: int = 1

    def fenced(self) -> object:
        return None

    def set_status(self, status: str) -> None:
        self.status = status


@dataclass
class StandInReshard:
    """Records the drained reports (`/reshard/<shard>`)."""

    reports: list[tuple[int, DrainedInfo]]

    def mark_drained(self, shard: int, info: DrainedInfo) -> bool:
        self.reports.append((shard, info))
        return True


@dataclass
class StandInPauses:
    """Pause flags by pipeline name, each with a version, as `PauseStore` keeps them."""

    flags: dict[str, StoredPause] = field(default_factory=dict)
    acknowledged: list[tuple[str, HeldBy]] = field(default_factory=list)

    def read(self, _shard: int, name: str) -> StoredPause | None:
        return self.flags.get(name)

    def resume_expired(self, _shard: int, name: str, stored: StoredPause) -> bool:
        if self.flags.get(name) != stored:
            return False
        del self.flags[name]
        return True

    def acknowledge(self, _shard: int, name: str, held: HeldBy) -> bool:
        self.acknowledged.append((name, held))
        return True


@dataclass
class StandInCoordinator:
    """The drained reports, the pause flags, and the election as a list of the nodes
    standing in it."""

    node_id: str
    reshard: StandInReshard
    standing: list[str] = field(default_factory=list)
    left: list[int] = field(default_factory=list)
    pauses: StandInPauses = field(default_factory=StandInPauses)

    def candidates(self, _shard: int) -> list[str]:
        return list(self.standing)

    def leave(self, shard: int) -> None:
        self.left.append(shard)
        self.standing.remove(self.node_id)

    def join(self, _shard: int, on_change: Any = None) -> Any:
        self.standing.append(self.node_id)
        return StandInLeadership(state=LeadershipState.FOLLOWER)


@pytest.fixture
def runner(tmp_path: Path) -> Iterator[tuple[ShardRunner, Harness]]:
    h = Harness(tmp_path, pipeline_config(), Topic(partitions=1))
    made: list[PipelineLeader] = []

    def make(_leadership: Leadership, only: str | None, drain: bool) -> list[PipelineLeader]:
        h.wal_dir_name = f"wal-{len(made)}"  # a stopped pipeline may still hold its WAL
        made.append(h.leader(drain=drain))
        return [made[-1]]

    shard = ShardRunner(
        0,
        # No election here: only the drained reports reach the coordinator.
        cast(Coordinator, StandInCoordinator("n1", StandInReshard([]))),
        make,
        metrics=Metrics.create(registry=CollectorRegistry()),
        flush_grace_s=1.0,
        stuck_after_s=60.0,
    )
    shard.leadership = cast(Any, StandInLeadership())
    yield shard, h
    shard.stop(0.0)
    for p in made:
        p.stop(0.0)


def test_a_pipeline_that_failed_to_start_is_replaced(
    runner: tuple[ShardRunner, Harness],
) -> None:
    shard, h = runner
    # An abandoned instance still holds the buffer's name for shard 0: the new term's
    # pipeline cannot register it and so cannot start.
    held = MemoryTable("events", h.leader().buffer.rows.schema, 1 << 20)
    h.catalog.add(held, 0)
    shard._thread.start()  # the shard's own event thread, as `start()` runs it
    shard._events.put(BecameLeader(epoch=1, token=1))
    wait_for(
        lambda: bool(shard.pipelines) and not shard.pipelines[0].status.state.live,
        "the term's pipeline to fail to start",
    )
    (first,) = shard.pipelines
    assert first.status.state is PipelineState.FAILED
    assert "already in the catalog" in (first.status.error or "")
    assert not shard.healthy()
    h.catalog.discard(held)  # the abandoned instance lets go
    # Restarts follow 1 s, 2 s, ... apart; one made after the names were released consumes.
    wait_for(
        lambda: shard.pipelines[0].status.state is PipelineState.CONSUMING,
        "a replacement that consumes",
        timeout=RESTART_BACKOFF.delay(1) + RESTART_BACKOFF.delay(2) + 10,
    )
    (second,) = shard.pipelines
    assert second is not first and second.status.restarts >= 1
    assert shard.healthy()
    wait_for(lambda: cast(StandInLeadership, shard.leadership).status == "consuming", "announce")


def test_a_reshard_drains_the_term_reports_it_and_its_end_resumes_consuming(
    runner: tuple[ShardRunner, Harness],
) -> None:
    shard, h = runner
    made: list[PipelineLeader] = []

    def make(_leadership: Leadership, only: str | None, drain: bool) -> list[PipelineLeader]:
        made.append(h.leader(drain=drain))  # one WAL: each stops cleanly before the next
        return [made[-1]]

    shard._make_pipelines = make
    h.topic.produce(0, 30)
    shard._thread.start()
    shard._events.put(BecameLeader(epoch=1, token=1))
    wait_for(lambda: h.fenced.checkpoint.get("events") == {0: 30}, "the first block committed")
    h.topic.produce(0, 20)
    wait_for(lambda: bool(shard.pipelines) and shard.pipelines[0].positions() == {0: 50}, "more")
    shard.reshard("ops@1")
    wait_for(
        lambda: bool(shard.pipelines) and shard.pipelines[0].status.state is PipelineState.DRAINED,
        "the term's pipeline drained",
    )
    reshard = cast(Any, shard._coordinator).reshard
    wait_for(lambda: bool(reshard.reports), "the drained report")
    assert reshard.reports == [(0, DrainedInfo("n1", 1, 1))]
    assert h.fenced.checkpoint["events"] == {0: 50} and h.fenced.pending is None
    drained = shard.pipelines[0]
    h.topic.produce(0, 10)  # not read while the reshard lasts, and the shard stays healthy
    time.sleep(1.2)  # two supervision ticks: a drained pipeline is not restarted
    assert shard.pipelines == [drained] and shard.healthy()
    assert h.fenced.checkpoint["events"] == {0: 50}
    shard.reshard(None)
    wait_for(lambda: h.fenced.checkpoint.get("events") == {0: 60}, "consuming again")
    assert shard.pipelines[0].status.state is PipelineState.CONSUMING
    assert len(reshard.reports) == 1
    shard.stop(0.0)
    for p in made:
        p.stop(0.0)


def test_a_reshard_that_starts_while_the_term_is_suspended_drains_once_resumed(
    runner: tuple[ShardRunner, Harness],
) -> None:
    shard, h = runner
    made: list[PipelineLeader] = []

    def make(_leadership: Leadership, only: str | None, drain: bool) -> list[PipelineLeader]:
        made.append(h.leader(drain=drain))
        return [made[-1]]

    shard._make_pipelines = make
    leadership = cast(Any, shard.leadership)
    shard._thread.start()
    shard._events.put(BecameLeader(epoch=1, token=1))
    wait_for(lambda: bool(made) and made[0].status.state is PipelineState.CONSUMING, "consuming")
    leadership.state = LeadershipState.SUSPENDED
    shard._events.put(Suspended())
    shard.reshard("ops@1")
    wait_for(lambda: not shard.pipelines, "the consuming pipeline stopped")
    time.sleep(0.6)  # a supervision tick: nothing starts while suspended
    assert len(made) == 1
    leadership.state = LeadershipState.LEADER
    shard._events.put(Resumed(epoch=1, token=1))
    wait_for(lambda: bool(cast(Any, shard._coordinator).reshard.reports), "the drained report")
    assert [p.drain for p in made] == [False, True]
    shard.stop(0.0)
    for p in made:
        p.stop(0.0)


def _standing_leader(shard: ShardRunner, others: list[str]) -> StandInCoordinator:
    """`shard` stands and leads, with `others` standing behind it."""
    coordinator = cast(StandInCoordinator, shard._coordinator)
    coordinator.standing = [coordinator.node_id, *others]
    shard.standing = True
    shard._wanted = dataclasses.replace(shard._wanted, stand=True)
    return coordinator


def test_a_leader_whose_disk_fails_hands_the_shard_over_and_stands_again_after_a_cooldown(
    runner: tuple[ShardRunner, Harness], tmp_path: Path
) -> None:
    shard, h = runner
    shard._handover = HandoverPolicy(cooldown_s=2.0)
    (tmp_path / "disk").write_text("a regular file where the data directory should be")
    h.wal_dir_name = "disk/wal"
    shard._make_pipelines = lambda _l, _only, drain: [h.leader(drain=drain)]
    coordinator = _standing_leader(shard, ["n2"])
    shard._thread.start()
    shard._events.put(BecameLeader(epoch=1, token=1))

    wait_for(lambda: coordinator.left == [0], "the failing leader to leave the election")
    assert not shard.pipelines and not shard.standing and coordinator.standing == ["n2"]
    assert shard.cooldown is not None
    assert "failed on this node's disk: NotADirectoryError" in shard.cooldown.reason
    assert str(tmp_path / "disk") in shard.cooldown.reason
    time.sleep(1.0)
    assert coordinator.standing == ["n2"], "stood again before the cool-down ended"
    wait_for(lambda: coordinator.standing == ["n2", "n1"], "standing again after the cool-down")
    assert shard.cooldown is None and shard.standing


def test_a_leader_failing_again_and_again_hands_over_but_the_last_candidate_keeps_trying(
    runner: tuple[ShardRunner, Harness],
) -> None:
    shard, h = runner
    shard._handover = HandoverPolicy(failures=2, cooldown_s=60.0)
    # An abandoned instance holds the buffer's names: every pipeline fails to start.
    held = MemoryTable("events", h.leader().buffer.rows.schema, 1 << 20)
    h.catalog.add(held, 0)
    coordinator = _standing_leader(shard, [])
    shard._thread.start()
    shard._events.put(BecameLeader(epoch=1, token=1))
    # Alone in the election: it keeps the shard and restarts (after 1 s, then 2 s).
    wait_for(
        lambda: bool(shard.pipelines) and shard.pipelines[0].status.restarts >= 2,
        "two restarts",
        timeout=RESTART_BACKOFF.delay(1) + RESTART_BACKOFF.delay(2) + 10,
    )
    assert coordinator.left == [] and shard.standing
    coordinator.standing.append("n2")  # a healthy replica stands now: the next failure moves
    wait_for(
        lambda: coordinator.left == [0],
        "the hand-over",
        timeout=RESTART_BACKOFF.delay(3) + 10,
    )
    assert shard.cooldown is not None
    assert "failed 3 times in 300 s, last: could not start" in shard.cooldown.reason
    assert shard.healthy()  # a follower again: nothing of this shard runs here


def test_a_pause_left_by_a_killed_command_is_resumed_by_the_leader_at_its_deadline(
    runner: tuple[ShardRunner, Harness],
) -> None:
    # `hakafka offsets set` paused the pipeline for its own duration and was killed; an ops
    # pause (no deadline) stays until ops resume it.
    shard, _h = runner
    pauses = cast(StandInCoordinator, shard._coordinator).pauses
    at = time.time()
    killed = PauseRecord(by="ops@host", at=at, reason="offsets set", deadline=at + 1.0)
    pauses.flags["events"] = StoredPause(killed, 1)
    pauses.flags["other"] = StoredPause(PauseRecord(by="ops", at=at, reason="ops pause"), 3)
    shard.paused = frozenset({"events", "other"})
    shard._thread.start()
    shard._events.put(BecameLeader(epoch=1, token=1))
    wait_for(lambda: "events" not in pauses.flags, "the expired pause resumed")
    assert time.time() >= at + 1.0
    assert set(pauses.flags) == {"other"}
    shard._events.put(_Pauses(frozenset({"other"})))  # the flag's deletion, via the watch
    wait_for(
        lambda: bool(shard.pipelines) and shard.pipelines[0].status.state.live,
        "the resumed pipeline running",
    )
