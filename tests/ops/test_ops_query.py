"""`hakafka query` over several shards: each shard asked of its leader for that shard only, so
a node leading several is never counted twice, and a shard that cannot answer fails the query
naming it instead of being left out.

A real Flight query server stands for a node leading shards 0 and 1; what ZooKeeper would say
(leaders, registered nodes) is an in-memory stand-in for the coordinator.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import cast

import pyarrow as pa
import pytest

from buffer import Catalog, MemoryTable, OffsetRange, QueryLimits, SqlEngine
from buffer.flight import FlightQueryServer
from devstack.process import free_port
from hakafka.coordination import Coordinator, LeaderInfo, NodeInfo
from hakafka.ops.cluster import OpsError
from hakafka.ops.query import query_shards

TOKEN = "query-token"
COUNT = "SELECT count(*) AS n, min(_shard) AS s FROM events"


@dataclass
class Directory:
    leaders: dict[int, str]
    registered: dict[str, NodeInfo] = field(default_factory=dict)

    def leader_of(self, shard: int) -> LeaderInfo | None:
        node = self.leaders.get(shard)
        return None if node is None else LeaderInfo(node=node, epoch=1, since=0.0)

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


def ask(directory: Directory, shards: list[int]) -> pa.Table:
    coordinator = cast(Coordinator, directory)
    return query_shards(coordinator, shards, COUNT, token=TOKEN, tls=None)


def test_a_node_leading_two_shards_is_asked_once_per_shard(directory: Directory) -> None:
    assert ask(directory, [0, 1]).to_pylist() == [{"n": 3, "s": 0}, {"n": 5, "s": 1}]
    assert ask(directory, [1]).to_pylist() == [{"n": 5, "s": 1}]


def test_a_shard_without_a_reachable_leader_fails_the_query_naming_it(
    directory: Directory,
) -> None:
    dead = f"grpc://127.0.0.1:{free_port()}"  # nothing listens there: its node was stopped
    directory.leaders[2] = "n2"
    directory.registered["n2"] = registration(dead)
    with pytest.raises(OpsError, match=f"^shard 2: its leader n2 at {dead}: ") as failed:
        ask(directory, [0, 1, 2])
    assert "failed to connect" in str(failed.value).lower()
    directory.leaders[3] = "n3"  # elected, not (or no longer) registered
    with pytest.raises(OpsError, match=r"^shard 3: its leader n3 is not registered$"):
        ask(directory, [0, 3])
    with pytest.raises(OpsError, match=r"^shard 4 has no leader right now"):
        ask(directory, [0, 1, 4])
    # The leader's own error (here: no table of that shard) names the shard too.
    directory.leaders[5] = "n1"
    with pytest.raises(OpsError, match=r"^shard 5: its leader n1 at .*events does not exist"):
        ask(directory, [5])
