"""`hakafka query` and `hakafka status` reach TLS nodes: with the CA of `server.tls_ca_file`
they get answers, without it they refuse the server, and a node address downgraded to plain
text in ZooKeeper never gets the token.

Real ZooKeeper (the node's registration and the shard's leader are written as a daemon
writes them), real TLS query servers in this process standing in for the node, and the
`hakafka` command as a child process.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from kazoo.client import KazooClient

from buffer import Catalog, MemoryTable, OffsetRange, QueryLimits, SqlEngine
from buffer.flight import FlightQueryServer
from buffer.http import HttpQueryServer, Route
from buffer.tls import ServerTls
from devstack.tls import CertificateFiles, make_certificates
from devstack.zookeeper import ZooKeeperEnsemble
from hakafka.coordination import LeaderInfo, NodeInfo, paths
from tests import commands

pytestmark = [pytest.mark.integration]

TOKEN = "tls-ops-token"
STATUS = {"node": "n1", "healthy": True, "shards": [], "settings_drift": None}


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> CertificateFiles:
    return make_certificates(tmp_path_factory.mktemp("tls"))


@pytest.fixture
def engine() -> Iterator[SqlEngine]:
    table = MemoryTable("events", pa.schema([("v", pa.int64())]), limit_bytes=1 << 20)
    table.append(pa.record_batch({"v": [7, 8, 9]}), {("t", 0): OffsetRange(0, 2)})
    catalog = Catalog()
    catalog.add(table)
    eng = SqlEngine(catalog, QueryLimits(timeout_s=10.0))
    yield eng
    eng.close()


@pytest.fixture
def servers(
    engine: SqlEngine, certs: CertificateFiles
) -> Iterator[tuple[HttpQueryServer, FlightQueryServer]]:
    tls = ServerTls(certs.cert_file, certs.key_file)
    status = Route(lambda: (200, "application/json", json.dumps(STATUS).encode()))
    http = HttpQueryServer(engine, token=TOKEN, routes={"/status": status}, tls=tls)
    http.start()
    flight = FlightQueryServer(engine, token=TOKEN, tls=tls)
    yield http, flight
    http.close()
    flight.shutdown()


@pytest.fixture
def zk(zookeeper: ZooKeeperEnsemble, zk_root: str) -> Iterator[KazooClient]:
    client = KazooClient(hosts=zookeeper.hosts, timeout=10.0)
    client.start(timeout=10)
    yield client
    client.delete(zk_root, recursive=True)
    client.stop()
    client.close()


Register = Callable[[str, str], None]


@pytest.fixture
def register(zk: KazooClient, zk_root: str) -> Register:
    """Write n1's registration with these URLs, and n1 as the leader of shard 0."""

    def write(http: str, flight: str) -> None:
        info = NodeInfo(host="h1", http=http, flight=flight, pid=os.getpid(), version="t")
        path = f"{zk_root}{paths.node('n1')}"
        if zk.exists(path):
            zk.set(path, info.encode())
        else:
            zk.create(path, info.encode(), makepath=True)
            leader = LeaderInfo(node="n1", epoch=1, since=time.time(), status="consuming")
            zk.create(f"{zk_root}{paths.leader(0)}", leader.encode(), makepath=True)

    return write


def write_config(path: Path, zookeeper: ZooKeeperEnsemble, zk_root: str, server: str) -> Path:
    path.write_text(
        f"""
node = "ops"
shards = [0]
[zookeeper]
hosts = "{zookeeper.hosts}"
root = "{zk_root}"
[kafka]
bootstrap = "127.0.0.1:1"
[clickhouse.replicas.0]
n1 = "127.0.0.1:1"
[server]
token = "{TOKEN}"
{server}
[[pipelines]]
name = "events"
topic = "events"
table = "events"
columns = {{ v = "Int64" }}
"""
    )
    return path


def test_query_and_status_over_tls(
    *,
    servers: tuple[HttpQueryServer, FlightQueryServer],
    register: Register,
    certs: CertificateFiles,
    zookeeper: ZooKeeperEnsemble,
    zk_root: str,
    tmp_path: Path,
) -> None:
    http, flight = servers
    assert http.url.startswith("https://") and flight.location.startswith("grpc+tls://")
    register(http.url, flight.location)
    trusting = write_config(
        tmp_path / "ca.toml", zookeeper, zk_root, f'tls_ca_file = "{certs.ca_file}"'
    )
    got = commands.hakafka(
        "query", "--config", str(trusting), "SELECT v FROM events ORDER BY v", "--json"
    )
    assert got.code == 0, got.err
    assert json.loads(got.out) == [{"v": 7}, {"v": 8}, {"v": 9}]
    status = commands.hakafka("status", "--config", str(trusting), "--json")
    (node,) = [n for n in json.loads(status.out)["nodes"] if n["node"] == "n1"]
    assert (node["healthy"], node["error"], node["http"]) == (True, None, http.url)

    # Without the CA (the system's CAs only), the node's certificate is refused.
    system = write_config(tmp_path / "system.toml", zookeeper, zk_root, "")
    refused = commands.hakafka("query", "--config", str(system), "SELECT 1", "--json")
    assert refused.code == 1
    assert "certificate verify failed" in refused.err
    status = commands.hakafka("status", "--config", str(system), "--json")
    (node,) = [n for n in json.loads(status.out)["nodes"] if n["node"] == "n1"]
    assert node["healthy"] is None and "CERTIFICATE_VERIFY_FAILED" in node["error"]

    # A registration rewritten to plain text: the TLS clients refuse it before connecting.
    plain_http, plain_flight = (
        http.url.replace("https", "http"),
        flight.location.replace("+tls", ""),
    )
    register(plain_http, plain_flight)
    downgraded = commands.hakafka("query", "--config", str(trusting), "SELECT 1", "--json")
    assert downgraded.code == 1
    assert (
        f"shard 0: its leader n1: {plain_flight} is not TLS, and this client requires TLS"
    ) in downgraded.err
    status = commands.hakafka("status", "--config", str(trusting), "--json")
    (node,) = [n for n in json.loads(status.out)["nodes"] if n["node"] == "n1"]
    assert f"{plain_http}/status is not TLS" in node["error"]
