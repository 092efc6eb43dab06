"""ClickHouse over HTTPS with a private CA: `[clickhouse] ca_file` makes the clients hakafka
builds (inserts, table checks, /ping) verify the server, with no `verify = false`.

The devstack ClickHouse front serving HTTPS with a certificate of a test CA.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from clickhouse_connect.driver.exceptions import OperationalError

from chlib.connection import Connection
from devstack.clickhouse import ClickHouseService
from devstack.process import running
from devstack.tls import CertificateFiles, make_certificates
from hakafka.config import parse_config
from hakafka.settings import connection_of
from tests.helpers.configs import minimal

pytestmark = [pytest.mark.integration]


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> CertificateFiles:
    return make_certificates(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def https_clickhouse(
    tmp_path_factory: pytest.TempPathFactory, certs: CertificateFiles
) -> Iterator[ClickHouseService]:
    service = ClickHouseService(tmp_path_factory.mktemp("ch-tls"), tls=certs)
    with running(service) as started:
        yield started


def connection_with(ca_file: Path, port: int) -> Connection:
    """The Connection hakafka builds from a config with `[clickhouse] ca_file`."""
    clickhouse = {
        "replicas": {"0": {"n1": f"127.0.0.1:{port}"}},
        "secure": True,
        "ca_file": str(ca_file),
    }
    return connection_of(parse_config(minimal(clickhouse=clickhouse)))


def test_the_ca_file_verifies_clickhouse(
    https_clickhouse: ClickHouseService, certs: CertificateFiles
) -> None:
    assert https_clickhouse.url.startswith("https://")
    host, port = https_clickhouse.host, https_clickhouse.port
    connection = connection_with(certs.ca_file, port)
    assert connection.ping(host, port, timeout=5.0)
    assert connection.client(host, port).command("SELECT 41 + 1") == 42
    # The Spark flush rebuilds the connection from its options: the CA comes along.
    rebuilt = Connection.from_options(connection.to_options())
    assert rebuilt.client(host, port).command("SELECT 1") == 1


def test_without_the_ca_file_the_certificate_is_refused(
    https_clickhouse: ClickHouseService,
) -> None:
    host, port = https_clickhouse.host, https_clickhouse.port
    system_cas = Connection(secure=True, connect_timeout=5.0)
    assert not system_cas.ping(host, port, timeout=5.0)
    with pytest.raises(OperationalError, match="CERTIFICATE_VERIFY_FAILED"):
        system_cas.client(host, port)
