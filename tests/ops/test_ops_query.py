"""`hakafka query` over several shards: each shard asked of its leader for that shard only, so
a node leading several is never counted twice, and a shard that cannot answer fails the query
naming it instead of being left out.

A real Flight query server stands for a node leading shards 0 and 1; what ZooKeeper would say
(leaders, registered nodes) is an in-memory stand-in for the coordinator.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import cast

import pyarrow as pa
import pytest

from buffer import Catalog, MemoryTable, OffsetRange, QueryLimits, SqlEngine
from buffer.flight import FlightQueryServer
from devstack.process import free_port
from hakafka.coordination import Coordinator, LeaderInfo, NodeInfo, PauseRecord
from hakafka.ops.cluster import OpsError
from hakafka.ops.query import DIALECT_HINT, Answer, query_shards

TOKEN = "query-token"
COUNT = "SELECT count(*) AS n, min(_shard) AS s FROM events"


@dataclass
class Pauses:
    held: dict[int, dict[str, PauseRecord]] = field(default_factory=dict)

    def paused(self, shard: int) -> dict[str, PauseRecord]:
        return dict(self.held.get(shard, {}))


@dataclass
class Directory:
    leaders: dict[int, str]
    registered: dict[str, NodeInfo] = field(default_factory=dict)
    skipped: dict[int, str] = field(default_factory=dict)  # of the last `ask`
    recovering: set[int] = field(default_factory=set)  # shards whose leader does not consume
    pauses: Pauses = field(default_factory=Pauses)

    def leader_of(self, shard: int) -> LeaderInfo | None:
        node = self.leaders.get(shard)
        status = "recovering" if shard in self.recovering else "consuming"
        return None if node is None else LeaderInfo(node=node, epoch=1, since=0.0, status=status)

    def nodes(self) -> dict[str, NodeInfo]:
        return dict(self.registered)


def registration(flight: str) -> NodeInfo:
    return NodeInfo(host="h", http="", flight=flight, pid=1, version="t")


@pytest.fixture
def directory() -> Iterator[Directory]:
    """n1 leads shards 0 (3 rows) and 1 (5 rows) and serves them over Flight."""
    catalog = Catalog()
    for shard, rows in ((0, 3), (1, 5)):
        table = MemoryTable("events", pa.schema([("v", pa.int64())]), limit_bytes=1 << 20)
        table.append(pa.record_batch({"v": range(rows)}), {("t", shard): OffsetRange(0, rows)})
        catalog.add(table, shard)
    engine = SqlEngine(catalog, QueryLimits(timeout_s=10.0))
    server = FlightQueryServer(engine, token=TOKEN)
    yield Directory({0: "n1", 1: "n1"}, {"n1": registration(server.location)})
    server.shutdown()
    engine.close()


def answer(
    directory: Directory,
    shards: list[int],
    wait_s: float = 0.5,
    partial: bool = False,
    sql: str = COUNT,
) -> Answer:
    coordinator = cast(Coordinator, directory)
    found = query_shards(
        coordinator, shards, sql, token=TOKEN, tls=None, wait_s=wait_s, partial=partial
    )
    directory.skipped = found.skipped
    return found


def ask(
    directory: Directory, shards: list[int], wait_s: float = 0.5, partial: bool = False
) -> pa.Table:
    return answer(directory, shards, wait_s, partial).table


def test_a_node_leading_two_shards_is_asked_once_per_shard(directory: Directory) -> None:
    assert ask(directory, [0, 1]).to_pylist() == [{"n": 3, "s": 0}, {"n": 5, "s": 1}]
    assert ask(directory, [1]).to_pylist() == [{"n": 5, "s": 1}]


def test_a_shard_without_a_reachable_leader_fails_the_query_naming_it_after_the_wait(
    directory: Directory,
) -> None:
    dead = f"grpc://127.0.0.1:{free_port()}"  # nothing listens there: its node was stopped
    directory.leaders[2] = "n2"
    directory.registered["n2"] = registration(dead)
    started = time.monotonic()
    with pytest.raises(
        OpsError, match=r"^shard 2: its leader n2 \(epoch 1\) does not answer: "
    ) as failed:
        ask(directory, [0, 1, 2], wait_s=1.0)
    assert 1.0 <= time.monotonic() - started < 5.0
    assert "failed to connect" in str(failed.value).lower()
    assert str(failed.value).endswith(
        "no next leader answered within 1 s; see `hakafka status`; --partial answers from the "
        "other shards"
    )
    directory.leaders[3] = "n3"  # elected, not (or no longer) registered
    with pytest.raises(
        OpsError, match=r"^shard 3: its leader n3 \(epoch 1\) does not answer: n3 is not registered"
    ):
        ask(directory, [0, 3])
    with pytest.raises(OpsError, match=r"^shard 4: it has no leader; no next leader answered"):
        ask(directory, [0, 1, 4])
    # The leader's own error (here: no table of that shard) fails at once, naming the shard.
    directory.leaders[5] = "n1"
    started = time.monotonic()
    with pytest.raises(OpsError, match=r"^shard 5: its leader n1 at .*events does not exist"):
        ask(directory, [5], wait_s=30.0)
    assert time.monotonic() - started < 5.0


def test_a_query_during_a_failover_waits_for_the_next_leader(directory: Directory) -> None:
    # Shard 1's leader n2 was killed: its `leader` znode names it until its session expires,
    # then n1 is elected. The query asks again until n1 answers.
    directory.leaders[1] = "n2"
    directory.registered["n2"] = registration(f"grpc://127.0.0.1:{free_port()}")
    elect = threading.Timer(1.0, lambda: directory.leaders.__setitem__(1, "n1"))
    elect.start()
    try:
        assert ask(directory, [0, 1], wait_s=10.0).to_pylist() == [
            {"n": 3, "s": 0},
            {"n": 5, "s": 1},
        ]
    finally:
        elect.cancel()


def test_partial_answers_from_the_shards_that_answer_and_names_the_others(
    directory: Directory,
) -> None:
    directory.leaders[2] = "n2"
    directory.registered["n2"] = registration(f"grpc://127.0.0.1:{free_port()}")
    table = ask(directory, [0, 1, 2, 3], wait_s=0.5, partial=True)
    assert table.to_pylist() == [{"n": 3, "s": 0}, {"n": 5, "s": 1}]
    assert sorted(directory.skipped) == [2, 3]
    assert directory.skipped[2].startswith("shard 2: its leader n2 (epoch 1) does not answer")
    assert directory.skipped[3] == "shard 3: it has no leader; no next leader answered within 0.5 s"


def test_a_paused_pipeline_is_named_with_who_paused_it_and_partial_skips_its_shard(
    directory: Directory,
) -> None:
    # Shard 2's leader runs no `events` pipeline: ops paused it there.
    directory.leaders[2] = "n1"
    directory.pauses.held[2] = {"events": PauseRecord(by="ops@h", at=time.time(), reason="swap")}
    with pytest.raises(OpsError) as paused:
        ask(directory, [0, 1, 2])
    assert str(paused.value).startswith(
        "shard 2: pipeline events is paused (by ops@h since "
    ) and str(paused.value).endswith(
        ": swap); its buffer is served again after `hakafka pipeline resume --pipeline events "
        "--shard 2`; see `hakafka status`; --partial answers from the other shards"
    )
    table = ask(directory, [0, 1, 2], partial=True)
    assert table.to_pylist() == [{"n": 3, "s": 0}, {"n": 5, "s": 1}]
    assert list(directory.skipped) == [2] and "is paused (by ops@h" in directory.skipped[2]


def test_rows_from_several_shards_are_labelled_and_a_recovering_leader_is_noted(
    directory: Directory,
) -> None:
    directory.recovering.add(1)
    found = answer(directory, [0, 1])
    assert found.labelled().to_pylist() == [
        {"shard": 0, "n": 3, "s": 0},
        {"shard": 1, "n": 5, "s": 1},
    ]
    assert found.notes == [
        "shard 1: its leader n1 is recovering, not consuming yet: its buffer may not hold "
        "every row it will serve"
    ]
    # Rows that carry `_shard` already are left as they are.
    rows = answer(directory, [0, 1], sql="SELECT _shard, v FROM events WHERE v = 0")
    assert rows.labelled().column_names == ["_shard", "v"]


def test_a_syntax_error_says_the_buffer_speaks_duckdb(directory: Directory) -> None:
    with pytest.raises(OpsError) as failed:
        answer(directory, [0], sql="SELECT at, v FROM events")
    assert "Parser Error" in str(failed.value)
    assert str(failed.value).endswith(f"({DIALECT_HINT})")
