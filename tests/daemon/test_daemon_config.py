"""Config validation: every problem is reported with its key and what is allowed."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from chlib.tables import Engine
from devstack.tls import make_certificates
from hakafka.config import (
    ClickHouseConfig,
    Config,
    ConfigError,
    KafkaConfig,
    NodeServerConfig,
    PipelineBufferConfig,
    PipelineConfig,
    PipelineWalConfig,
    SparkConfig,
    ZooKeeperConfig,
    load_config,
    parse_config,
)
from hakafka.consumer import Format, OnError, OutOfRange
from hakafka.coordination import ZkTls
from hakafka.settings import lane_count, zk_config
from tests.helpers.configs import GOOD, NOWHERE, minimal, problems_of, write
from wal import FsyncPolicy


def test_good_config_parses(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, GOOD))
    assert config.node == "node-1"
    assert config.shards == (0, 1)
    assert config.zookeeper.session_timeout == 4.0
    assert [c.name for c in config.pipelines[0].columns] == ["id", "name"]
    assert config.pipelines[0].meta_columns[:2] == ("_partition", "_offset")
    assert config.pipelines[0].dead_letter_table == "events_dead_letter"
    assert str(config.clickhouse.replicas[0]["node-2"]) == "127.0.0.1:8124"
    assert config.pipelines[0].wal.fsync is FsyncPolicy.ALWAYS
    assert config.pipelines[0].on_error is OnError.DEAD_LETTER
    assert config.clickhouse.engine is Engine.REPLICATED_MERGE_TREE
    assert config.pipelines[0].buffer.max_rows == 100


def test_secrets_never_in_repr(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, GOOD))
    text = repr(config)
    assert "ch-secret" not in text
    assert "kafka-secret" not in text
    assert config.clickhouse.password.value == "ch-secret"


def test_environment_overrides_secrets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HAKAFKA_CLICKHOUSE_PASSWORD", "from-env")
    monkeypatch.setenv("HAKAFKA_KAFKA_SASL_PASSWORD", "kafka-from-env")
    config = load_config(write(tmp_path, GOOD))
    assert config.clickhouse.password.value == "from-env"
    assert config.kafka.settings["sasl.password"] == "kafka-from-env"


def test_password_file(tmp_path: Path) -> None:
    secret = tmp_path / "ch.pass"
    secret.write_text("from-file\n")
    text = GOOD.replace('password = "ch-secret"', f'password_file = "{secret}"')
    assert load_config(write(tmp_path, text)).clickhouse.password.value == "from-file"


def without_env_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in os.environ:
        if name.startswith("HAKAFKA_"):  # secrets and Kafka settings from the environment
            monkeypatch.delenv(name)


def test_non_loopback_bind_without_token_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    without_env_secrets(monkeypatch)
    public = GOOD + '\n[server]\nhttp = "0.0.0.0:8300"\nflight = "10.1.2.3:8301"\n'
    assert problems_of(tmp_path, public) == [
        "server.http: binds 0.0.0.0, reachable from other hosts, without a token; set "
        "server.token_file (or HAKAFKA_SERVER_TOKEN), or bind 127.0.0.1",
        "server.flight: binds 10.1.2.3, reachable from other hosts, without a token; set "
        "server.token_file (or HAKAFKA_SERVER_TOKEN), or bind 127.0.0.1",
    ]
    token = tmp_path / "server.token"
    token.write_text("s3cret\n")
    with_token = public + f'token_file = "{token}"\n'
    assert load_config(write(tmp_path, with_token)).server.token.value == "s3cret"
    monkeypatch.setenv("HAKAFKA_SERVER_TOKEN", "from-env")
    assert load_config(write(tmp_path, public)).server.token.value == "from-env"
    monkeypatch.delenv("HAKAFKA_SERVER_TOKEN")
    for http, flight in (("127.0.0.2:8300", "localhost:8301"), ("[::1]:8300", "::1:8301")):
        loopback = GOOD + f'\n[server]\nhttp = "{http}"\nflight = "{flight}"\n'
        assert not load_config(write(tmp_path, loopback)).server.token


def test_empty_secret_variable_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # An empty variable would override token_file and silently turn auth off.
    without_env_secrets(monkeypatch)
    token = tmp_path / "server.token"
    token.write_text("s3cret\n")
    text = GOOD + f'\n[server]\ntoken_file = "{token}"\n'
    for name in (
        "HAKAFKA_SERVER_TOKEN",
        "HAKAFKA_CLICKHOUSE_PASSWORD",
        "HAKAFKA_KAFKA_SASL_PASSWORD",
    ):
        monkeypatch.setenv(name, "")
    assert problems_of(tmp_path, text) == [
        "kafka.settings.sasl.password: the environment variable HAKAFKA_KAFKA_SASL_PASSWORD is "
        "set but empty; unset it",
        "clickhouse.password: the environment variable HAKAFKA_CLICKHOUSE_PASSWORD is set but "
        "empty; unset it",
        "server.token: the environment variable HAKAFKA_SERVER_TOKEN is set but empty; unset it",
    ]


def test_empty_secret_file_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    without_env_secrets(monkeypatch)
    token = tmp_path / "server.token"
    token.write_text("\n")
    text = GOOD + f'\n[server]\ntoken_file = "{token}"\n'
    assert problems_of(tmp_path, text) == [f"server.token_file: {token} is empty"]


def test_mistyped_secret_is_not_echoed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    without_env_secrets(monkeypatch)
    text = GOOD.replace('password = "ch-secret"', "password = 987654321")
    text += '\n[server]\ntoken = ["tok-246813579"]\n'
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, text))
    assert err.value.problems == [
        "clickhouse.password: must be a string, got an integer",
        "server.token: must be a string, got an array",
    ]
    assert "987654321" not in str(err.value) and "246813579" not in str(err.value)


def test_zookeeper_password_never_in_repr(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    without_env_secrets(monkeypatch)
    text = GOOD.replace(
        'root = "/hakafka/test"',
        'root = "/hakafka/test"\nauth_user = "hakafka"\nauth_password = "zk-secret-pw"',
    )
    config = load_config(write(tmp_path, text))
    zk = zk_config(config)
    assert zk.auth == ("hakafka", "zk-secret-pw")
    assert "zk-secret-pw" not in repr(zk) and "zk-secret-pw" not in repr(config)


def test_every_problem_named_with_its_key(tmp_path: Path) -> None:
    text = (
        GOOD.replace('on_error = "dead_letter"', 'on_error = "ignore"')
        .replace("max_rows = 100", "max_rows = 5")
        .replace('fsync = "always"', 'fsync = "sometimes"')
        .replace("session_timeout = 4", 'session_timeout = "4s"')
        .replace('root = "/hakafka/test"', 'root = "hakafka"')
        .replace('id = "Int64"', 'id = "Int64"\n_bad = "String"')
        .replace('node-2 = "http://127.0.0.1:8124"', 'node-2 = "nowhere"')
    )
    problems = problems_of(tmp_path, "bogus_key = 1\n" + text + "\nwal_typo = 1\n")
    expected = [
        "pipelines[0].on_error: must be one of dead_letter, skip, fail; got 'ignore'",
        "pipelines[0].buffer.min_rows: must not exceed max_rows (10 > 5)",
        "pipelines[0].wal.fsync: must be one of always, batch, interval, off; got 'sometimes'",
        "zookeeper.session_timeout: must be a number, got a string '4s'",
        "zookeeper.root: must be an absolute ZooKeeper path like /hakafka/prod, got 'hakafka'",
        "clickhouse.replicas.0.node-2: must be host:port, got 'nowhere'",
        "bogus_key: unknown key",
        "pipelines[0].wal.wal_typo: unknown key",
    ]
    for line in expected:
        assert line in problems, (line, problems)
    assert any(
        p.startswith("pipelines[0].columns._bad: column names must be identifiers")
        for p in problems
    )


def test_missing_sections_and_required_keys(tmp_path: Path) -> None:
    problems = problems_of(tmp_path, 'node = "n1"\n')
    for line in (
        "shards: is required",
        "pipelines: is required",
        "zookeeper: is required",
        "kafka: is required",
    ):
        assert line in problems


def test_shards_must_be_below_shard_count(tmp_path: Path) -> None:
    problems = problems_of(tmp_path, GOOD.replace("shard_count = 2", "shard_count = 1"))
    assert any(
        p.startswith("shards: must be a non-empty array of shard numbers below shard_count (1)")
        for p in problems
    )


def test_explicit_partition_lists_cover_every_shard_once(tmp_path: Path) -> None:
    # A shard without a list would read `p % shard_count`, overlapping the lists.
    one = GOOD.replace("[pipelines.columns]", "partitions = {0 = [0, 1]}\n[pipelines.columns]")
    assert (
        "pipelines[0].partitions.1: missing; with explicit partition lists every shard needs "
        "one (shards without: [1])"
    ) in problems_of(tmp_path, one)
    both = GOOD.replace(
        "[pipelines.columns]", "partitions = {0 = [0, 1], 1 = [1, 2]}\n[pipelines.columns]"
    )
    assert "pipelines[0].partitions: partition 1 is assigned to shard 0 and to shard 1" in (
        problems_of(tmp_path, both)
    )


def test_unreadable_and_invalid_toml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read the file"):
        load_config(tmp_path / "missing.toml")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(write(tmp_path, "node = \n"))


def test_managed_kafka_settings_refused_by_config_check(tmp_path: Path) -> None:
    # These were passed to librdkafka or refused only when a node first led (after a clean
    # `config check`); isolation.level = read_uncommitted would have let aborted rows in.
    managed = {
        "group.id": '"mine"',
        "isolation.level": '"read_uncommitted"',
        "auto.offset.reset": '"earliest"',
        "enable.partition.eof": "true",
        "enable.auto.offset.store": "true",
    }
    lines = "".join(f'"{key}" = {value}\n' for key, value in managed.items())
    path = write(tmp_path, GOOD.replace('"security.protocol" = "SASL_SSL"\n', lines))
    checked = config_check(path)
    assert checked.returncode == 1, checked
    for key in managed:
        assert (
            f"  - kafka.settings.{key}: is managed by hakafka (exactly-once relies on it)\n"
            in checked.stderr
        )


def test_type_checker_is_applied(tmp_path: Path) -> None:
    def check(ch_type: str) -> str | None:
        return (
            None if ch_type in ("Int64", "String") else f"unsupported ClickHouse type {ch_type!r}"
        )

    text = GOOD.replace('name = "String"', 'name = "Map(String, String)"')
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, text), check)
    assert (
        "pipelines[0].columns.name: unsupported ClickHouse type 'Map(String, String)'"
        in err.value.problems
    )


def test_shipped_example_config_is_valid(monkeypatch: pytest.MonkeyPatch) -> None:
    # Its ZooKeeper password is a systemd credential, absent here; the variable wins over it.
    monkeypatch.setenv("HAKAFKA_ZK_PASSWORD", "example-password")
    example = Path(__file__).resolve().parents[2] / "systemd" / "hakafka.toml"
    config = load_config(example)
    assert config.node == "ch-node-1"
    assert config.spark.handoff_ports == "41000-41099"  # the range a firewall opens
    assert config.pipelines[0].table == "events"
    assert [c.name for c in config.pipelines[0].columns] == [
        "event_id",
        "user_id",
        "kind",
        "amount",
        "at",
    ]


def test_merge_tree_may_name_several_endpoints_for_a_shard(tmp_path: Path) -> None:
    # One server may sit behind several addresses (a proxy per node): no address tells one
    # server from two, so the tables' UUIDs are compared when init and each term connect.
    config = load_config(write(tmp_path, GOOD.replace('engine = "ReplicatedMergeTree"\n', "")))
    assert config.clickhouse.engine is Engine.MERGE_TREE
    assert len(set(config.clickhouse.replicas[0].values())) == 2


def test_every_choice_names_the_enum_values(tmp_path: Path) -> None:
    text = (
        GOOD.replace('engine = "ReplicatedMergeTree"', 'engine = "Log"')
        .replace(
            'bootstrap = "127.0.0.1:9092"', 'bootstrap = "127.0.0.1:9092"\nout_of_range = "latest"'
        )
        .replace('on_error = "dead_letter"', 'on_error = "dead_letter"\nformat = "parquet"')
    )
    problems = problems_of(tmp_path, text)
    for line in (
        "clickhouse.engine: must be one of MergeTree, ReplicatedMergeTree; got 'Log'",
        "kafka.out_of_range: must be one of fail, earliest; got 'latest'",
        "pipelines[0].format: must be one of json, raw, csv, avro, protobuf; got 'parquet'",
    ):
        assert line in problems, (line, problems)


def test_left_out_keys_take_the_dataclass_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    without_env_secrets(monkeypatch)
    config = parse_config(minimal())
    assert (config.shard_count, config.data_dir) == (Config.shard_count, Config.data_dir)
    assert config.zookeeper == ZooKeeperConfig(hosts=NOWHERE)
    assert config.kafka == KafkaConfig(bootstrap=NOWHERE)
    assert config.kafka.out_of_range is OutOfRange.FAIL
    assert config.clickhouse == ClickHouseConfig(replicas=config.clickhouse.replicas)
    assert (config.spark, config.server) == (SparkConfig(), NodeServerConfig())
    (pipeline,) = config.pipelines
    # _partition and _offset move first: the one difference from the declared default.
    assert set(pipeline.meta_columns) == set(PipelineConfig.meta_columns)
    assert pipeline == PipelineConfig(
        name="p", topic="t", table="p", columns=pipeline.columns, meta_columns=pipeline.meta_columns
    )
    assert (pipeline.buffer, pipeline.wal) == (PipelineBufferConfig(), PipelineWalConfig())
    assert (pipeline.format, pipeline.on_error) == (Format.JSON, OnError.DEAD_LETTER)


def config_check(path: Path) -> subprocess.CompletedProcess[str]:
    """`hakafka config check PATH` through the installed console script, as operators run it."""
    script = Path(sys.executable).with_name("hakafka")
    return subprocess.run(
        [str(script), "config", "check", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_config_check_command_names_every_bad_key_and_passes_a_good_file(tmp_path: Path) -> None:
    good = write(tmp_path, GOOD)
    ok = config_check(good)
    assert (ok.returncode, ok.stderr) == (0, ""), ok.stderr
    assert ok.stdout == f"{good}: ok (node node-1, shards [0, 1] of 2, pipelines events)\n"

    bad = tmp_path / "bad.toml"
    bad.write_text(
        "bogus_key = 1\n"
        + textwrap.dedent(GOOD)
        .replace('on_error = "dead_letter"', 'on_error = "ignore"')
        .replace('fsync = "always"', 'fsync = "sometimes"')
        .replace("session_timeout = 4", 'session_timeout = "4s"')
        .replace("max_rows = 100", "max_rows = 5")
        .replace('name = "String"', 'name = "Variant(String, UInt8)"')
    )
    failed = config_check(bad)
    assert failed.returncode == 1 and failed.stdout == "", failed
    lines = failed.stderr.splitlines()
    assert lines[0] == f"hakafka: invalid configuration {bad}:"
    expected = [
        "  - bogus_key: unknown key",
        "  - pipelines[0].on_error: must be one of dead_letter, skip, fail; got 'ignore'",
        "  - pipelines[0].wal.fsync: must be one of always, batch, interval, off; got 'sometimes'",
        "  - zookeeper.session_timeout: must be a number, got a string '4s'",
        "  - pipelines[0].buffer.min_rows: must not exceed max_rows (10 > 5)",
    ]
    for line in expected:
        assert line in lines, (line, lines)
    # The ClickHouse type check is the command's own (load_config alone accepts any type).
    (column,) = [line for line in lines if line.startswith("  - pipelines[0].columns.name: ")]
    assert column.startswith("  - pipelines[0].columns.name: ClickHouse type 'Variant(String, ")
    assert "'Variant(String, UInt8)' is not supported" in column and "supported: Int8" in column
    assert len(lines) == 1 + len(expected) + 1, lines

    missing = config_check(tmp_path / "missing.toml")
    assert missing.returncode == 1
    assert "cannot read the file: No such file or directory" in missing.stderr


def test_a_data_dir_that_is_not_a_writable_directory_stops_check_and_run(tmp_path: Path) -> None:
    blocker = tmp_path / "blocker"
    blocker.write_text("a regular file")
    text = textwrap.dedent(GOOD).replace(
        'data_dir = "/tmp/hakafka-data"', f'data_dir = "{blocker}/data"'
    )
    bad = write(tmp_path, text)
    failed = config_check(bad)
    assert failed.returncode == 1 and failed.stdout == "", failed
    assert failed.stderr.splitlines() == [
        f"hakafka: invalid configuration {bad}:",
        f"  - data_dir: {blocker}/data cannot be created: {blocker} is not a directory",
    ]
    # `run` refuses it before it touches anything (ZooKeeper is not even reachable here).
    script = Path(sys.executable).with_name("hakafka")
    run = subprocess.run(
        [str(script), "run", "--config", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 1, run
    assert f"data_dir: {blocker}/data cannot be created: {blocker} is not a directory" in (
        run.stderr
    )
    assert not (blocker.parent / "data").exists()

    (tmp_path / "file").write_text("")
    text = textwrap.dedent(GOOD).replace(
        'data_dir = "/tmp/hakafka-data"', f'data_dir = "{tmp_path / "file"}"'
    )
    failed = config_check(write(tmp_path, text))
    assert f"data_dir: {tmp_path / 'file'} is not a directory" in failed.stderr


def test_zookeeper_tls_keys_are_checked_as_a_set(tmp_path: Path) -> None:
    certs = make_certificates(tmp_path / "certs")
    zk = 'root = "/hakafka/test"\nsession_timeout = 4'

    def with_zookeeper(lines: str) -> str:
        return GOOD.replace(zk, f"{zk}\n{lines}")

    config = load_config(
        write(
            tmp_path,
            with_zookeeper(
                f'tls = true\nca_file = "{certs.ca_file}"\ncert_file = "{certs.cert_file}"\n'
                f'key_file = "{certs.key_file}"'
            ),
        )
    )
    assert zk_config(config).tls == ZkTls(
        str(certs.ca_file), str(certs.cert_file), str(certs.key_file)
    )
    assert zk_config(load_config(write(tmp_path, with_zookeeper("tls = true")))).tls == ZkTls()
    assert zk_config(load_config(write(tmp_path, GOOD))).tls is None
    assert problems_of(tmp_path, with_zookeeper(f'ca_file = "{certs.ca_file}"')) == [
        "zookeeper.ca_file: is set but zookeeper.tls is false: set tls = true to use it"
    ]
    assert problems_of(
        tmp_path, with_zookeeper(f'tls = true\ncert_file = "{certs.cert_file}"')
    ) == ["zookeeper.key_file: is required with zookeeper.cert_file (both or neither)"]
    assert problems_of(
        tmp_path,
        with_zookeeper(f'tls = true\ncert_file = "{certs.ca_file}"\nkey_file = "{certs.key_file}"'),
    )[0].startswith("zookeeper.cert_file: cannot load it with zookeeper.key_file: ")
    not_a_ca = with_zookeeper(f'tls = true\nca_file = "{certs.key_file}"')
    assert problems_of(tmp_path, not_a_ca) == [
        f"zookeeper.ca_file: {certs.key_file} holds no PEM CA certificate "
        "(NO_CERTIFICATE_OR_CRL_FOUND)"
    ]


def test_require_tls_refuses_each_plain_hop_by_name(tmp_path: Path) -> None:
    certs = make_certificates(tmp_path / "certs")
    plain = GOOD.replace('"security.protocol" = "SASL_SSL"', '"security.protocol" = "PLAINTEXT"')
    plain = plain.replace('node = "node-1"', 'require_tls = true\nnode = "node-1"')
    plain += '\n[spark]\nmaster = "spark://10.0.0.9:7077"\n'
    plain += '\n[schema_registry]\nurl = "https://r1:8081, http://r2:8081"\n'
    assert problems_of(tmp_path, plain) == [
        "require_tls: ZooKeeper: zookeeper.tls is false (set it, and connect to secureClientPort)",
        'require_tls: Kafka: kafka.settings."security.protocol" is PLAINTEXT (use SSL or SASL_SSL)',
        "require_tls: ClickHouse: clickhouse.secure is false (HTTPS to every replica)",
        "require_tls: query servers and the Spark handoff: server.tls_cert_file is not set "
        "(HTTPS, grpc+tls, and the slices executors fetch)",
        "require_tls: schema registry: schema_registry.url is http:// (use https://)",
        "require_tls: Spark RPC: spark.master is a cluster but spark.conf sets neither "
        "spark.network.crypto.enabled nor spark.ssl.rpc.enabled to true",
    ]
    secure = (
        GOOD.replace('node = "node-1"', 'require_tls = true\nnode = "node-1"')
        .replace(
            "session_timeout = 4", f'session_timeout = 4\ntls = true\nca_file = "{certs.ca_file}"'
        )
        .replace('engine = "ReplicatedMergeTree"', 'engine = "ReplicatedMergeTree"\nsecure = true')
    )
    secure += (
        f'\n[server]\ntls_cert_file = "{certs.cert_file}"\ntls_key_file = "{certs.key_file}"\n'
        '\n[spark]\nremote = "sc://spark:15002/;use_ssl=true"\nhandoff_host = "10.0.0.1"\n'
    )
    assert load_config(write(tmp_path, secure)).require_tls is True
    remote = secure.replace(";use_ssl=true", "")
    assert problems_of(tmp_path, remote) == [
        "require_tls: Spark Connect: spark.remote has no ;use_ssl=true"
    ]


def test_lanes_are_auto_or_a_count(tmp_path: Path) -> None:
    def with_lanes(value: str) -> str:
        return GOOD.replace("[pipelines.columns]", f"lanes = {value}\n[pipelines.columns]")

    assert load_config(write(tmp_path, GOOD)).pipelines[0].lanes == "auto"
    assert load_config(write(tmp_path, with_lanes("3"))).pipelines[0].lanes == 3
    for bad, shown in (("0", "0"), ('"many"', "'many'")):
        assert (
            f'pipelines[0].lanes: must be "auto" or a number of lanes >= 1, got {shown}'
            in problems_of(tmp_path, with_lanes(bad))
        )
    auto = load_config(write(tmp_path, GOOD)).pipelines[0]
    assert lane_count(auto, cores=16) == auto.lanes_max == 8
    assert lane_count(auto, cores=2) == 2
    assert lane_count(load_config(write(tmp_path, with_lanes("1"))).pipelines[0], cores=16) == 1
