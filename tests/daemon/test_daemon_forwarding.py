"""Forwarding a query to the shard's leader goes one hop at most, never back into the sender,
and over TLS when the nodes serve it.

Real Flight query servers on loopback, each forwarding through the daemon's `Forwarder`; what
ZooKeeper would say (leaders, registered nodes) is an in-memory directory per node, so that
two nodes can disagree about a leader as they do for a moment after an election.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pytest

from buffer import Catalog, MemoryTable, OffsetRange, QueryLimits, SqlEngine
from buffer.client import QueryFailedError, query
from buffer.flight import FlightQueryServer
from buffer.tls import ClientTls, ServerTls
from devstack.process import free_port
from devstack.tls import CertificateFiles, make_certificates
from hakafka.coordination import LeaderInfo, NodeInfo
from hakafka.daemon.forwarding import Forwarder

TOKEN = "fwd-token"
WAIT_S = 10.0
SQL = "SELECT who FROM events"


@dataclass
class Directory:
    """One node's view of ZooKeeper: `leaders` its own, `registered` shared by all."""

    node_id: str
    registered: dict[str, NodeInfo]
    leaders: dict[int, str] = field(default_factory=dict)

    @property
    def endpoints(self) -> NodeInfo:
        return self.registered[self.node_id]

    def leader_of(self, shard: int) -> LeaderInfo | None:
        node = self.leaders.get(shard)
        return None if node is None else LeaderInfo(node=node, epoch=1, since=0.0)

    def nodes(self) -> dict[str, NodeInfo]:
        return dict(self.registered)


@dataclass
class Node:
    """A query server answering `who = <name>` from its buffer, forwarding like a daemon."""

    name: str
    server: FlightQueryServer
    directory: Directory
    leading: list[int]
    forwarded: list[Mapping[str, str]]  # every call of its forward, with its parameters


class Cluster:
    def __init__(self, tls: ServerTls | None, client: ClientTls | None) -> None:
        self.tls, self.client = tls, client
        self.registered: dict[str, NodeInfo] = {}
        self.nodes: dict[str, Node] = {}
        self._engines: list[SqlEngine] = []

    def add(self, name: str, leading: list[int], advertise: str | None = None) -> Node:
        table = MemoryTable("events", pa.schema([("who", pa.string())]), limit_bytes=1 << 20)
        table.append(pa.record_batch({"who": [name]}), {("t", 0): OffsetRange(0, 0)})
        catalog = Catalog()
        catalog.add(table)
        engine = SqlEngine(catalog, QueryLimits(timeout_s=WAIT_S))
        self._engines.append(engine)
        directory = Directory(name, self.registered)
        forwarded: list[Mapping[str, str]] = []
        forwarder = Forwarder(
            directory, (0,), lambda: leading, TOKEN, self.client, wait_s=1.0, timeout_s=WAIT_S
        )

        def forward(sql: str, params: Mapping[str, str]) -> pa.Table | None:
            forwarded.append(dict(params))
            return forwarder(sql, params)

        server = FlightQueryServer(engine, token=TOKEN, forward=forward, tls=self.tls)
        self.registered[name] = NodeInfo(
            host="h", http="", flight=advertise or server.location, pid=1, version="t"
        )
        node = Node(name, server, directory, leading, forwarded)
        self.nodes[name] = node
        return node

    def close(self) -> None:
        for node in self.nodes.values():
            node.server.shutdown()
        for engine in self._engines:
            engine.close()


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> CertificateFiles:
    return make_certificates(tmp_path_factory.mktemp("tls"))


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    c = Cluster(None, None)
    yield c
    c.close()


def ask(node: Node, client: ClientTls | None = None) -> list[str]:
    table = query(node.server.location, SQL, TOKEN, WAIT_S, tls=client)
    return [str(v) for v in table.column("who").to_pylist()]


def test_a_follower_forwards_once_to_the_leader(cluster: Cluster) -> None:
    a, b = cluster.add("a", leading=[]), cluster.add("b", leading=[0])
    a.directory.leaders[0] = b.directory.leaders[0] = "b"
    assert ask(a) == ["b"]
    assert a.forwarded == [{}]
    # b leads: it answers, no second hop, over the shard the query was forwarded for.
    assert b.forwarded == [{"forwarded_by": "a", "shard": "0"}]


def test_a_forwarded_query_reads_only_its_shard_at_a_leader_of_several(cluster: Cluster) -> None:
    # b leads shards 0 and 1: one name over both buffers; what a forwards for shard 1 reads
    # only shard 1's rows there.
    a, b = cluster.add("a", leading=[]), cluster.add("b", leading=[0, 1])
    shard1 = MemoryTable("events", pa.schema([("who", pa.string())]), limit_bytes=1 << 20)
    shard1.append(pa.record_batch({"who": ["b1", "b1"]}), {("t", 1): OffsetRange(0, 1)})
    b.server.engine.catalog.add(shard1, 1)
    a.directory.leaders.update({0: "b", 1: "b"})
    sql = "SELECT who, _shard FROM events"
    got = query(a.server.location, sql, TOKEN, WAIT_S, shard=1)
    assert got.to_pylist() == [{"who": "b1", "_shard": 1}] * 2
    assert b.forwarded == [{"forwarded_by": "a", "shard": "1"}]
    # Asked without a shard, b answers over every shard it leads.
    assert sorted(ask(b)) == ["b", "b1", "b1"]


def test_a_forwarded_query_stops_at_a_node_that_does_not_lead_the_shard(
    cluster: Cluster,
) -> None:
    # a still sees b as the leader; b already sees c: b refuses rather than forward again.
    a, b, c = (cluster.add(n, leading=[]) for n in ("a", "b", "c"))
    c.leading.append(0)
    a.directory.leaders[0] = "b"
    b.directory.leaders[0] = c.directory.leaders[0] = "c"
    with pytest.raises(QueryFailedError) as failed:
        ask(a)
    assert "shard 0: forwarded by a to b, which does not lead it" in str(failed.value)
    # a asks b again (its view may lag ZooKeeper's) until its wait is over: a few times, and
    # b never passes the query on.
    assert len(a.forwarded) == 1 and 1 <= len(b.forwarded) <= 6 and c.forwarded == []


def test_forwarding_to_its_own_address_is_refused(cluster: Cluster) -> None:
    # Two hosts whose nodes both advertise 127.0.0.1:<same port>: a's "leader" b is a itself.
    a = cluster.add("a", leading=[])
    cluster.add("b", leading=[0], advertise=a.server.location)
    a.directory.leaders[0] = "b"
    with pytest.raises(QueryFailedError) as failed:
        ask(a)
    assert (
        f"shard 0: its leader b registered {a.server.location}, the address of a itself; "
        "set server.advertise on both nodes"
    ) in str(failed.value)
    assert a.forwarded == [{}]


def test_forwarding_over_tls_verifies_the_leader_and_refuses_plain_text(
    certs: CertificateFiles,
) -> None:
    trusted = ClientTls(Path(certs.ca_file))
    c = Cluster(ServerTls(certs.cert_file, certs.key_file), trusted)
    try:
        a, b = c.add("a", leading=[]), c.add("b", leading=[0])
        a.directory.leaders[0] = "b"
        assert b.server.location.startswith("grpc+tls://")
        assert ask(a, trusted) == ["b"]
        # A registration downgraded to plain text does not get the token.
        c.registered["b"] = NodeInfo(
            host="h", http="", flight=b.server.location.replace("+tls", ""), pid=1, version="t"
        )
        with pytest.raises(QueryFailedError, match="is not TLS, and this client requires TLS"):
            ask(a, trusted)
        assert len(b.forwarded) == 1
    finally:
        c.close()


def test_a_query_during_a_failover_is_forwarded_to_the_next_leader(cluster: Cluster) -> None:
    # b was killed: shard 0's `leader` still names it until its session expires, then c is
    # elected. a's forwarder asks again until c answers (within its wait).
    a = cluster.add("a", leading=[])
    cluster.add("c", leading=[0])
    cluster.registered["b"] = NodeInfo(
        host="h", http="", flight=f"grpc://127.0.0.1:{free_port()}", pid=1, version="t"
    )
    a.directory.leaders[0] = "b"
    elect = threading.Timer(0.3, lambda: a.directory.leaders.__setitem__(0, "c"))
    elect.start()
    try:
        assert ask(a) == ["c"]
    finally:
        elect.cancel()
    # With no leader at all, the query fails once the wait is over, naming the shard.
    del a.directory.leaders[0]
    started = time.monotonic()
    with pytest.raises(QueryFailedError) as failed:
        ask(a)
    assert "shard 0: it has no leader; no next leader answered within 1 s" in str(failed.value)
    assert 1.0 <= time.monotonic() - started < 5.0
