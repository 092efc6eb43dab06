"""A two-node cluster serving HTTPS and grpc+tls: the nodes register TLS URLs, a follower
forwards queries to the leader over grpc+tls (verified with `server.tls_ca_file`), and a
plain-text client gets nothing. Real stack: ZooKeeper, the broker, ClickHouse, `hakafka run`.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient

from buffer.client import query as remote_query
from buffer.tls import ClientTls
from devstack.cluster import StackEndpoints
from devstack.process import wait_until
from devstack.records import create_topic, produce
from devstack.tls import make_certificates
from hakafka.coordination import NodeInfo, paths

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.slow]

TOKEN = "tls-cluster-token"
PARTITIONS = 4
HELD = {"min_rows": 1_000_000, "max_age": 300}  # nothing flushes: rows stay in the buffer


def registered(hosts: str, zk_root: str, node: str) -> NodeInfo:
    zk = KazooClient(hosts=hosts, timeout=10.0)
    zk.start(timeout=10)
    try:
        path = f"{zk_root}{paths.node(node)}"
        return NodeInfo.decode(path, zk.get(path)[0])
    finally:
        zk.stop()
        zk.close()


def test_a_tls_cluster_registers_tls_urls_and_forwards_over_tls(
    *, make_cluster: Any, stack: StackEndpoints, topic_prefix: str, zk_root: str, tmp_path: Path
) -> None:
    certs = make_certificates(tmp_path / "tls")
    create_topic(stack.kafka, f"{topic_prefix}_events", PARTITIONS)
    server = {
        "token": TOKEN,
        "tls_cert_file": str(certs.cert_file),
        "tls_key_file": str(certs.key_file),
        "tls_ca_file": str(certs.ca_file),
    }
    cluster = make_cluster({"n1": [0], "n2": [0]}, buffer=HELD, server=server)
    cluster.start()
    leader = cluster.nodes[cluster.wait_leaders([0])[0]]
    (follower,) = (n for n in cluster.nodes.values() if n is not leader)
    for node in (leader, follower):
        info = registered(stack.zookeeper, zk_root, node.name)
        assert (info.http, info.flight) == (
            f"https://127.0.0.1:{node.http_port}",
            f"grpc+tls://127.0.0.1:{node.flight_port}",
        )

    produced = produce(stack.kafka, f"{topic_prefix}_events", 2_000, partitions=PARTITIONS)
    held = {(p, o) for p, o in produced.good if p % 2 == 0}  # shard 0: the even partitions
    wait_until(
        lambda: sum(p["buffer_rows"] for p in leader.pipelines()) == len(held),
        timeout=120,
        what="the leader's buffer to hold shard 0's rows",
    )
    trusted = ClientTls(certs.ca_file)
    flight = f"grpc+tls://127.0.0.1:{follower.flight_port}"
    for url in (follower.url, flight):
        got = remote_query(url, "SELECT _partition, _offset FROM events", TOKEN, 30, tls=trusted)
        pairs = set(zip(got["_partition"].to_pylist(), got["_offset"].to_pylist(), strict=True))
        assert pairs == held, url

    # The HTTPS port answers nothing to plain HTTP.
    with socket.create_connection(("127.0.0.1", follower.http_port), timeout=10) as sock:
        sock.settimeout(10)
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert not sock.recv(4096).startswith(b"HTTP/")
