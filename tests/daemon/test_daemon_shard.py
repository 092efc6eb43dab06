"""ShardRunner's supervision of its pipelines, with in-memory pipeline parts and a stand-in
leadership and coordinator (no ZooKeeper): a pipeline that fails to start is replaced, not
counted healthy; during a reshard the term's pipelines drain, the shard reports it, and they
consume again when it ends."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
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
    LeadershipEvent,
    LeadershipState,
    PauseRecord,
    Resumed,
    Suspended,
)
from hakafka.coordination.pause import StoredPause
from hakafka.daemon.restarts import RESTART_BACKOFF, HandoverPolicy
from hakafka.daemon.shard import DEFAULT_HANDOVER, ShardRunner
from hakafka.metrics import Metrics
from hakafka.pipeline import PipelineLeader, PipelineState
from tests.pipeline.fakes import Harness, Topic, pipeline_config, wait_for


@dataclass
class StandInLeadership:
    """The part of a Leadership the shard's supervision reads."""

    state: LeadershipState = LeadershipState.FOLLOWER
    status: str = "standing"
    epoch: int = 1
    token: int = 1

    def fenced(self) -> object:
        return None

    def set_status(self, status: str) -> None:
        self.status = status


@dataclass
class StandInReshard:
    """Records the drained reports (`/reshard/<shard>`)."""

    reports: list[tuple[int, DrainedInfo]] = field(default_factory=list)

    def mark_drained(self, shard: int, info: DrainedInfo) -> bool:
        self.reports.append((shard, info))
        return True


@dataclass
class StandInPauses:
    """Pause flags by pipeline name, each with a version, as `PauseStore` keeps them; the
    watch is told of every change, as ZooKeeper's would be."""

    flags: dict[str, StoredPause] = field(default_factory=dict)
    acknowledged: list[tuple[str, HeldBy]] = field(default_factory=list)
    watcher: Callable[[frozenset[str]], None] | None = None

    def watch(self, _shard: int, on_change: Callable[[frozenset[str]], None]) -> None:
        self.watcher = on_change
        on_change(frozenset(self.flags))

    def read(self, _shard: int, name: str) -> StoredPause | None:
        return self.flags.get(name)

    def resume_expired(self, _shard: int, name: str, stored: StoredPause) -> bool:
        if self.flags.get(name) != stored:
            return False
        del self.flags[name]
        if self.watcher is not None:
            self.watcher(frozenset(self.flags))
        return True

    def acknowledge(self, _shard: int, name: str, held: HeldBy) -> bool:
        self.acknowledged.append((name, held))
        return True


@dataclass
class StandInCoordinator:
    """The drained reports, the pause flags, and the election: a list of the nodes standing
    in it, and the leadership events of this node's candidacy, told as the election would."""

    node_id: str
    reshard: StandInReshard = field(default_factory=StandInReshard)
    standing: list[str] = field(default_factory=list)
    left: list[int] = field(default_factory=list)
    pauses: StandInPauses = field(default_factory=StandInPauses)
    leadership: StandInLeadership | None = None
    """The candidacy of this node's latest join."""
    on_change: Callable[[LeadershipEvent], None] | None = None

    def candidates(self, _shard: int) -> list[str]:
        return list(self.standing)

    def leave(self, shard: int) -> None:
        self.left.append(shard)
        self.standing.remove(self.node_id)

    def join(self, _shard: int, on_change: Callable[[LeadershipEvent], None]) -> Any:
        self.standing.append(self.node_id)
        self.leadership, self.on_change = StandInLeadership(), on_change
        return self.leadership

    def tell(self, state: LeadershipState, event: LeadershipEvent) -> None:
        """The candidacy is now in `state`, and says so with `event`."""
        assert self.leadership is not None and self.on_change is not None, "no candidacy"
        self.leadership.state = state
        self.on_change(event)


def lead(shard: ShardRunner, coordinator: StandInCoordinator) -> None:
    """Start `shard` and make it stand; its candidacy wins the election (epoch 1)."""
    shard.start()
    shard.stand()
    wait_for(lambda: coordinator.on_change is not None, "the shard standing")
    coordinator.tell(LeadershipState.LEADER, BecameLeader(epoch=1, token=1))


MakePipelines = Callable[[Leadership, str | None, bool], list[PipelineLeader]]


@dataclass
class Rig:
    """A shard runner over in-memory pipeline parts, and the stand-in coordinator it uses."""

    shard: ShardRunner
    h: Harness
    coordinator: StandInCoordinator


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Callable[..., Rig]]:
    """Makes the rig: `make(h)` builds each term's pipelines (by default one per term, each
    over its own WAL directory), `handover` is the shard's hand-over policy."""
    made: list[PipelineLeader] = []
    runners: list[ShardRunner] = []

    def one_wal_each(h: Harness) -> MakePipelines:
        def make(_leadership: Leadership, only: str | None, drain: bool) -> list[PipelineLeader]:
            h.wal_dir_name = f"wal-{len(made)}"  # a stopped pipeline may still hold its WAL
            return [h.leader(drain=drain)]

        return make

    def build(
        make: Callable[[Harness], MakePipelines] = one_wal_each,
        handover: HandoverPolicy = DEFAULT_HANDOVER,
    ) -> Rig:
        h = Harness(tmp_path, pipeline_config(), Topic(partitions=1))
        coordinator = StandInCoordinator("n1")
        make_pipelines = make(h)

        def recorded(leadership: Leadership, only: str | None, drain: bool) -> list[PipelineLeader]:
            pipelines = make_pipelines(leadership, only, drain)
            made.extend(pipelines)  # stopped at the end of the test
            return pipelines

        shard = ShardRunner(
            0,
            cast(Coordinator, coordinator),
            recorded,
            metrics=Metrics.create(registry=CollectorRegistry()),
            flush_grace_s=1.0,
            stuck_after_s=60.0,
            handover=handover,
        )
        runners.append(shard)
        return Rig(shard, h, coordinator)

    yield build
    for shard in runners:
        shard.stop(0.0)
    for p in made:
        p.stop(0.0)


def test_a_pipeline_that_failed_to_start_is_replaced(rig: Callable[..., Rig]) -> None:
    r = rig()
    shard, h = r.shard, r.h
    # An abandoned instance still holds the buffer's name for shard 0 past the new term's
    # wait for it (none here): the pipeline cannot register it and so cannot start.
    h.release_wait_s = 0.0
    held = MemoryTable("events", h.leader().buffer.rows.schema, 1 << 20)
    h.catalog.add(held, 0)
    lead(shard, r.coordinator)
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


def one_wal(h: Harness) -> MakePipelines:
    """Each term's pipeline over the same WAL: each stops cleanly before the next starts."""
    return lambda _leadership, _only, drain: [h.leader(drain=drain)]


def test_a_reshard_drains_the_term_reports_it_and_its_end_resumes_consuming(
    rig: Callable[..., Rig],
) -> None:
    r = rig(make=one_wal)
    shard, h, reshard = r.shard, r.h, r.coordinator.reshard
    h.topic.produce(0, 30)
    lead(shard, r.coordinator)
    wait_for(lambda: h.fenced.checkpoint.get("events") == {0: 30}, "the first block committed")
    h.topic.produce(0, 20)
    wait_for(lambda: bool(shard.pipelines) and shard.pipelines[0].positions() == {0: 50}, "more")
    shard.reshard("ops@1")
    wait_for(
        lambda: bool(shard.pipelines) and shard.pipelines[0].status.state is PipelineState.DRAINED,
        "the term's pipeline drained",
    )
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


def test_a_reshard_that_starts_while_the_term_is_suspended_drains_once_resumed(
    rig: Callable[..., Rig],
) -> None:
    made: list[PipelineLeader] = []

    def recording(h: Harness) -> MakePipelines:
        def make(_leadership: Leadership, only: str | None, drain: bool) -> list[PipelineLeader]:
            made.append(h.leader(drain=drain))
            return [made[-1]]

        return make

    r = rig(make=recording)
    shard, coordinator = r.shard, r.coordinator
    lead(shard, coordinator)
    wait_for(lambda: bool(made) and made[0].status.state is PipelineState.CONSUMING, "consuming")
    coordinator.tell(LeadershipState.SUSPENDED, Suspended())
    shard.reshard("ops@1")
    wait_for(lambda: not shard.pipelines, "the consuming pipeline stopped")
    time.sleep(0.6)  # a supervision tick: nothing starts while suspended
    assert len(made) == 1
    coordinator.tell(LeadershipState.LEADER, Resumed(epoch=1, token=1))
    wait_for(lambda: bool(coordinator.reshard.reports), "the drained report")
    assert [p.drain for p in made] == [False, True]


def test_a_leader_whose_disk_fails_hands_the_shard_over_and_stands_again_after_a_cooldown(
    rig: Callable[..., Rig], tmp_path: Path
) -> None:
    (tmp_path / "disk").write_text("a regular file where the data directory should be")

    def on_the_file(h: Harness) -> MakePipelines:
        h.wal_dir_name = "disk/wal"
        return one_wal(h)

    r = rig(make=on_the_file, handover=HandoverPolicy(cooldown_s=2.0))
    shard, coordinator = r.shard, r.coordinator
    coordinator.standing = ["n2"]  # standing behind this node, which leads
    lead(shard, coordinator)

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
    rig: Callable[..., Rig],
) -> None:
    r = rig(handover=HandoverPolicy(failures=2, cooldown_s=60.0))
    shard, h, coordinator = r.shard, r.h, r.coordinator
    # An abandoned instance holds the buffer's names past every wait: each pipeline fails.
    h.release_wait_s = 0.0
    held = MemoryTable("events", h.leader().buffer.rows.schema, 1 << 20)
    h.catalog.add(held, 0)
    lead(shard, coordinator)
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
    assert "failed 3 times in 300 s, last: PreviousInstanceError" in shard.cooldown.reason
    assert shard.healthy()  # a follower again: nothing of this shard runs here


def test_a_pause_left_by_a_killed_command_is_resumed_by_the_leader_at_its_deadline(
    rig: Callable[..., Rig],
) -> None:
    # `hakafka offsets set` paused the pipeline for its own duration and was killed; an ops
    # pause (no deadline) stays until ops resume it.
    r = rig()
    shard, pauses = r.shard, r.coordinator.pauses
    at = time.time()
    killed = PauseRecord(by="ops@host", at=at, reason="offsets set", deadline=at + 1.0)
    pauses.flags["events"] = StoredPause(killed, 1)
    pauses.flags["other"] = StoredPause(PauseRecord(by="ops", at=at, reason="ops pause"), 3)
    lead(shard, r.coordinator)
    wait_for(lambda: "events" not in pauses.flags, "the expired pause resumed")
    assert time.time() >= at + 1.0
    assert set(pauses.flags) == {"other"}
    # The flag's deletion reached the shard through the watch: the pipeline runs again.
    wait_for(
        lambda: bool(shard.pipelines) and shard.pipelines[0].status.state.live,
        "the resumed pipeline running",
    )
