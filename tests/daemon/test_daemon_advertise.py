"""What a node registers (`server.advertise`, TLS schemes), the config errors that keep a
multi-host cluster from registering loopback, the TLS keys of `[server]`, and
`[clickhouse] ca_file` reaching the ClickHouse client and the Spark flush's options."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from chlib.connection import Connection
from devstack.tls import CertificateFiles, make_certificates
from hakafka.config import ConfigError, parse_config
from hakafka.daemon.node import node_info
from hakafka.settings import client_tls, connection_of, server_tls

TOKEN = "advertise-token"


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> CertificateFiles:
    return make_certificates(tmp_path_factory.mktemp("tls"))


@pytest.fixture(autouse=True)
def no_env_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HAKAFKA_SERVER_TOKEN", "HAKAFKA_CLICKHOUSE_PASSWORD", "HAKAFKA_ZK_PASSWORD"):
        monkeypatch.delenv(name, raising=False)


def config_of(
    server: dict[str, Any], replicas: dict[str, str], clickhouse: dict[str, Any] | None = None
) -> Any:
    return parse_config(
        {
            "node": "n1",
            "shards": [0],
            "zookeeper": {"hosts": "zk1:2181"},
            "kafka": {"bootstrap": "k:9092"},
            "clickhouse": {
                "replicas": {"0": replicas},
                "engine": "ReplicatedMergeTree",
                **(clickhouse or {}),
            },
            "server": {"token": TOKEN, **server},
            "pipelines": [{"name": "p", "topic": "t", "table": "p", "columns": {"v": "Int64"}}],
        }
    )


def problems_of(server: dict[str, Any], replicas: dict[str, str], **clickhouse: Any) -> list[str]:
    with pytest.raises(ConfigError) as failed:
        config_of(server, replicas, clickhouse)
    return failed.value.problems


MULTI_HOST = {"n1": "ch1:8123", "n2": "ch2:8123"}
WILDCARD = {"http": "0.0.0.0:8300", "flight": "0.0.0.0:8301"}


def test_a_wildcard_bind_without_advertise_on_a_multi_host_cluster_is_an_error() -> None:
    assert problems_of(WILDCARD, MULTI_HOST) == [
        "server.advertise: unset, so this node registers 127.0.0.1 (from its binds), which "
        "other hosts cannot reach, while the cluster spans hosts ([clickhouse.replicas] has "
        "n2 = ch2:8123); set server.advertise to the name or address others reach this node at"
    ]
    # The default loopback bind, and an explicit loopback advertise, are refused alike.
    assert problems_of({}, MULTI_HOST)[0].startswith(
        "server.advertise: unset, so this node registers 127.0.0.1 (from its binds)"
    )
    assert problems_of({"advertise": "localhost"}, MULTI_HOST)[0].startswith(
        "server.advertise: localhost is a loopback address, which other hosts cannot reach"
    )


def test_advertise_names_what_a_node_registers() -> None:
    config = config_of({**WILDCARD, "advertise": "node-1.example"}, MULTI_HOST)
    info = node_info(config, 8300, 8301)
    assert (info.http, info.flight) == ("http://node-1.example:8300", "grpc://node-1.example:8301")


def test_one_host_clusters_register_loopback_for_a_wildcard_bind() -> None:
    # Every other node's ClickHouse is on loopback: all nodes share this host.
    one_host = {"n1": "127.0.0.1:8123", "n2": "127.0.0.1:8124"}
    info = node_info(config_of(WILDCARD, one_host), 8300, 8301)
    assert (info.http, info.flight) == ("http://127.0.0.1:8300", "grpc://127.0.0.1:8301")
    routable = {"http": "10.1.2.3:8300", "flight": "10.1.2.3:8301"}
    info = node_info(config_of(routable, MULTI_HOST), 1, 2)
    assert (info.http, info.flight) == ("http://10.1.2.3:1", "grpc://10.1.2.3:2")


def test_advertise_is_a_bare_host() -> None:
    for bad in ("node-1:8300", "http://node-1", "node 1"):
        assert problems_of({"advertise": bad}, {"n1": "127.0.0.1:8123"}) == [
            f"server.advertise: must be a host name or IP address without scheme or port, "
            f"got {bad!r}"
        ]


def test_tls_keys_register_https_and_grpc_tls(certs: CertificateFiles) -> None:
    tls = {"tls_cert_file": str(certs.cert_file), "tls_key_file": str(certs.key_file)}
    config = config_of({**tls, "advertise": "node-1.example"}, MULTI_HOST)
    info = node_info(config, 8300, 8301)
    assert (info.http, info.flight) == (
        "https://node-1.example:8300",
        "grpc+tls://node-1.example:8301",
    )
    served = server_tls(config)
    assert served is not None and served.cert_file == certs.cert_file
    # Clients then require TLS, against the system's CAs unless tls_ca_file names some.
    client = client_tls(config)
    assert client is not None and client.ca_file is None
    with_ca = config_of({**tls, "tls_ca_file": str(certs.ca_file)}, {"n1": "127.0.0.1:1"})
    assert client_tls(with_ca) == client_tls(
        config_of({"tls_ca_file": str(certs.ca_file)}, {"n1": "127.0.0.1:1"})
    )
    plain = config_of({}, {"n1": "127.0.0.1:1"})
    assert (server_tls(plain), client_tls(plain)) == (None, None)


def test_tls_files_come_in_pairs_and_must_load(certs: CertificateFiles, tmp_path: Path) -> None:
    one = {"n1": "127.0.0.1:1"}
    assert problems_of({"tls_cert_file": str(certs.cert_file)}, one) == [
        "server.tls_key_file: is required with server.tls_cert_file (both or neither)"
    ]
    assert problems_of({"tls_key_file": str(certs.key_file)}, one) == [
        "server.tls_cert_file: is required with server.tls_key_file (both or neither)"
    ]
    missing = str(tmp_path / "nope.pem")
    assert problems_of({"tls_cert_file": missing, "tls_key_file": str(certs.key_file)}, one) == [
        f"server.tls_cert_file: cannot read {missing}: No such file or directory"
    ]
    other = make_certificates(tmp_path / "other")
    (mismatch,) = problems_of(
        {"tls_cert_file": str(certs.cert_file), "tls_key_file": str(other.key_file)}, one
    )
    assert mismatch.startswith("server.tls_cert_file: cannot load it with server.tls_key_file:")
    assert "KEY_VALUES_MISMATCH" in mismatch
    not_pem = tmp_path / "ca.txt"
    not_pem.write_text("not a certificate\n")
    (bad_ca,) = problems_of({"tls_ca_file": str(not_pem)}, one)
    assert bad_ca.startswith(f"server.tls_ca_file: {not_pem} holds no PEM CA certificate")


def test_clickhouse_ca_file_reaches_the_client_and_the_spark_options(
    certs: CertificateFiles,
) -> None:
    ca = str(certs.ca_file)
    config = config_of({}, {"n1": "127.0.0.1:1"}, {"secure": True, "ca_file": ca})
    connection = connection_of(config)
    assert connection.ca_cert == ca
    # The Spark flush gets the connection as string options and rebuilds it from them.
    options = connection.to_options()
    assert options["ca_cert"] == ca
    assert Connection.from_options(options) == connection
    assert problems_of({}, {"n1": "127.0.0.1:1"}, ca_file=ca) == [
        "clickhouse.ca_file: verifies ClickHouse's certificate: needs secure = true, verify = true"
    ]
