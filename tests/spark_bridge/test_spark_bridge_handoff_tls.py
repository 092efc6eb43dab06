"""The flush's slice handoff over TLS and on a fixed port range (#34): `[server]`'s certificate
and `[spark] handoff_ports` through `settings.handoff_options` into real flushes (local Spark,
real Flight, the ClickHouse front), the CA reaching the tasks in the job's closure only."""

from __future__ import annotations

import importlib
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import structlog
from pyspark.sql import SparkSession

from chlib import ensure_table
from devstack.clickhouse import ClickHouseService
from devstack.tls import CertificateFiles, make_certificates
from hakafka.config import parse_config
from hakafka.settings import handoff_options
from spark_bridge.flush import FlushTarget, flush_block
from spark_bridge.handoff import (
    HandoffOptions,
    HandoffPortsError,
    HandoffTls,
    HandoffTrustError,
    PortRange,
    SliceHandoff,
)
from tests.helpers.configs import GOOD, minimal, problems_of
from tests.helpers.landing import stats
from tests.helpers.spark_blocks import make_block, replica, spec
from tests.spark_bridge.spark_secret_probe import cmdline, descendants

ToEvents = Callable[[HandoffOptions], FlushTarget]


def options_of(server: dict[str, str], spark: dict[str, str]) -> HandoffOptions:
    """The handoff options hakafka builds from a config with these `[server]` and `[spark]`
    keys."""
    return handoff_options(parse_config(minimal(server=server, spark=spark)))


def tls_keys(certs: CertificateFiles, ca_file: Path | None) -> dict[str, str]:
    """`[server]` TLS keys: `certs`' certificate and key, `ca_file` as the CA (if any)."""
    keys = {"tls_cert_file": str(certs.cert_file), "tls_key_file": str(certs.key_file)}
    return keys | ({"tls_ca_file": str(ca_file)} if ca_file else {})


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


# -- config ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("written", "problem"),
    [
        ('"abc"', "must be a port or a range FIRST-LAST such as \"41000-41099\", got 'abc'"),
        ('"41000-"', "must be a port or a range FIRST-LAST such as \"41000-41099\", got '41000-'"),
        (
            '"41000,41001"',
            "must be a port or a range FIRST-LAST such as \"41000-41099\", got '41000,41001'",
        ),
        ('"0-10"', "ports must be within 1..65535, got 0-10"),
        ('"65000-65536"', "ports must be within 1..65535, got 65000-65536"),
        ('"41099-41000"', "the first port must not exceed the last, got 41099-41000"),
        ("41000", "must be a string, got an integer 41000"),
    ],
)
def test_handoff_ports_problems_name_the_key(tmp_path: Path, written: str, problem: str) -> None:
    text = GOOD + f"\n[spark]\nhandoff_ports = {written}\n"
    assert problems_of(tmp_path, text) == [f"spark.handoff_ports: {problem}"]


def test_handoff_options_from_the_config(tmp_path: Path) -> None:
    assert options_of({}, {}) == HandoffOptions()
    assert options_of({}, {"handoff_ports": "41000-41099"}).ports == PortRange(
        41000, 41099, "spark.handoff_ports"
    )
    assert options_of({}, {"handoff_ports": " 41000 "}).ports == PortRange(
        41000, 41000, "spark.handoff_ports"
    )
    certs = make_certificates(tmp_path / "tls")
    # The node's certificate, verified for the name it carries: the advertised host.
    tls = options_of(tls_keys(certs, certs.ca_file) | {"advertise": "localhost"}, {}).tls
    assert tls == HandoffTls(certs.cert_file, certs.key_file, certs.ca_file, "localhost")
    assert options_of(tls_keys(certs, None), {}).tls == HandoffTls(
        certs.cert_file, certs.key_file, None, "127.0.0.1"
    )


def test_what_reaches_the_tasks_shows_no_ticket_and_no_ca(tmp_path: Path) -> None:
    certs = make_certificates(tmp_path / "tls")
    options = HandoffOptions(tls=HandoffTls(certs.cert_file, certs.key_file, certs.ca_file))
    with SliceHandoff("127.0.0.1", [pa.table({"v": [1]})], options=options) as handoff:
        shown = repr(handoff.source)
        assert handoff.source.root_certs == certs.ca_file.read_bytes()
        assert "BEGIN" not in shown and repr(handoff.source.tickets[0]) not in shown
    assert "BEGIN" not in repr(options)  # paths only, never a file's content


# -- flushes ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> CertificateFiles:
    return make_certificates(tmp_path_factory.mktemp("handoff-tls"))


@pytest.fixture
def locations(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The location of every handoff the flushes of this test open, in order."""
    opened: list[str] = []

    class Recorded(SliceHandoff):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            opened.append(self.source.location)

    # The module: the package's attribute `flush` is the function.
    monkeypatch.setattr(importlib.import_module("spark_bridge.flush"), "SliceHandoff", Recorded)
    return opened


@pytest.fixture
def to_events(clickhouse: ClickHouseService, ch_database: str, ch_client: Any) -> ToEvents:
    """Targets of this test's (new, empty) `events` table, 50k rows per task, handing the
    slices off as told."""
    ensure_table(ch_client, spec(ch_database))

    def to(handoff: HandoffOptions) -> FlushTarget:
        replicas = (replica(clickhouse),)
        return FlushTarget(
            ch_database, "events", replicas, "pipe", rows_per_task=50_000, handoff=handoff
        )

    return to


@pytest.fixture(params=["another CA", "the system's CAs"])
def task_ca(request: pytest.FixtureRequest, tmp_path: Path) -> Path | None:
    """The CA file the tasks are sent: one that did not sign the node's certificate, or none
    (the system's CAs)."""
    if request.param == "another CA":
        return make_certificates(tmp_path / "other", "other").ca_file
    return None


def secrets_in_sight(spark: SparkSession, texts: list[str]) -> list[str]:
    """Which of `texts` show in the session's conf (what Spark's UI lists) or in the
    arguments of this process's descendants (the driver JVM, the Python workers)."""
    conf = repr(spark.sparkContext.getConf().getAll()) + repr(spark.conf.getAll)
    argv = repr([cmdline(pid) for pid in descendants(os.getpid())])
    return [t for t in texts if t in conf or t in argv]


@pytest.mark.integration
@pytest.mark.spark
def test_a_flush_over_a_tls_handoff_lands_its_rows_exactly_once(
    spark: SparkSession,
    to_events: ToEvents,
    ch_client: Any,
    certs: CertificateFiles,
    locations: list[str],
) -> None:
    target = to_events(options_of(tls_keys(certs, certs.ca_file), {}))
    block = make_block(200_000, "tls")
    with structlog.testing.capture_logs() as logs:
        result = flush_block(spark, block, target)
        assert (result.rows, result.tasks, result.attempts) == (200_000, 4, 1)
        # The same block again: same tasks, same tokens, nothing added.
        assert flush_block(spark, block, target).tasks == 4
    assert stats(ch_client) == (200_000, 200_000)
    assert ch_client.query("SELECT sum(v) FROM events").result_rows[0][0] == sum(range(200_000))
    assert [location.split(":")[0] for location in locations] == ["grpc+tls", "grpc+tls"]
    # The CA went to the tasks in the job's closure, the key nowhere: neither is in Spark's
    # conf, a process's arguments or a log line.
    key, ca = certs.key_file.read_text(), certs.ca_file.read_text()
    secret = [key.splitlines()[1], ca.splitlines()[1], str(certs.key_file)]
    assert secrets_in_sight(spark, secret) == []
    assert not [text for text in secret if text in repr(logs)]


@pytest.mark.integration
@pytest.mark.spark
def test_a_task_that_does_not_trust_the_handoff_fails_the_flush_saying_so(
    spark: SparkSession,
    to_events: ToEvents,
    ch_client: Any,
    certs: CertificateFiles,
    task_ca: Path | None,
) -> None:
    target = to_events(options_of(tls_keys(certs, task_ca), {}))
    with pytest.raises(HandoffTrustError) as refused:
        flush_block(spark, make_block(1_000, "untrusted"), target)
    text = str(refused.value)
    assert text.startswith(
        "this task does not trust the certificate of the slice handoff at grpc+tls://127.0.0.1:"
    )
    against = "the system's CAs" if task_ca is None else "the CA sent with the job"
    assert f" for the name 127.0.0.1 (verified against {against}): " in text
    assert "certificate verify failed" in text and "\n" not in text
    assert stats(ch_client) == (0, 0)  # refused before a row was read, never sent in plain text


@pytest.mark.integration
@pytest.mark.spark
def test_a_one_port_range_is_held_by_one_handoff_at_a_time(
    spark: SparkSession, to_events: ToEvents, ch_client: Any, locations: list[str]
) -> None:
    port = free_port()
    handoff = options_of({}, {"handoff_ports": str(port)})
    target = to_events(handoff)
    assert flush_block(spark, make_block(20_000, "p1"), target).rows == 20_000
    # Released when that flush's handoff closed: the next flush takes the port again.
    assert flush_block(spark, make_block(20_000, "p2", start=20_000), target).rows == 20_000
    assert locations == [f"grpc://127.0.0.1:{port}"] * 2
    # While another flush's handoff holds it, a flush is refused, naming the key.
    with SliceHandoff("127.0.0.1", [pa.table({"v": [1]})], options=handoff) as holder:
        assert holder.source.location == f"grpc://127.0.0.1:{port}"
        with pytest.raises(HandoffPortsError) as refused:
            flush_block(spark, make_block(20_000, "p3", start=40_000), target)
        assert pa.Table.from_batches(holder.source.fetch(0))["v"].to_pylist() == [1]
    assert str(refused.value) == (
        f"spark.handoff_ports: no free port in {port} on 127.0.0.1 for a flush's slice "
        "handoff: each is in use (by the handoffs of other flushes in progress, or by other "
        "programs); widen spark.handoff_ports or free a port"
    )
    assert stats(ch_client) == (40_000, 40_000)
    assert flush_block(spark, make_block(20_000, "p3", start=40_000), target).rows == 20_000
    assert stats(ch_client) == (60_000, 60_000)
