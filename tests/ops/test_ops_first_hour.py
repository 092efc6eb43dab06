"""The operator's first hour: the mistakes a new user makes with each command, made as they
would make them (a child process; its exit code and the text they read), on the local stack.
README "Common mistakes" lists them with what to do."""

from __future__ import annotations

import getpass
import json
import re
import signal
import socket
from pathlib import Path
from typing import Any

import pytest

from devstack.cluster import LocalCluster, StackEndpoints
from devstack.process import free_port
from devstack.records import create_topic, produce
from tests.commands import Run, edit

pytestmark = [pytest.mark.integration]


def one_line(run: Run) -> str:
    """The single line a failed command printed (exit 1, no traceback, nothing from kazoo)."""
    assert run.code == 1, f"exit {run.code}\n{run.out}\n{run.err}"
    lines = run.err.strip().splitlines()
    assert len(lines) == 1, run.err
    assert "Traceback" not in run.err and "Connection dropped" not in run.err
    return lines[0]


def copy_config(source: Path, name: str) -> Path:
    copy = source.with_name(name)
    copy.write_text(source.read_text())
    return copy


def test_config_check_takes_config_and_refuses_what_run_would_trip_on(
    make_cluster: Any, hakafka: Any, tmp_path: Path
) -> None:
    cluster: LocalCluster = make_cluster({"n1": [0, 1]})
    config = cluster.nodes["n1"].config_path

    # --config, like every other command; the positional form stays.
    for args in (["--config", str(config)], [str(config)]):
        ok = hakafka("config", "check", *args)
        assert ok.code == 0, ok.err
        assert ok.out.startswith(f"{config}: ok (node n1, shards [0, 1] of 2")

    # One port for both servers: refused here, not at `run` blaming "another hakafka".
    shared = copy_config(config, "shared-port.toml")
    port = re.search(r'^http = "127\.0\.0\.1:(\d+)"$', shared.read_text(), re.M)
    assert port is not None
    edit(shared, r'^flight = "127\.0\.0\.1:\d+"$', f'flight = "127.0.0.1:{port.group(1)}"')
    refused = hakafka("config", "check", "--config", str(shared))
    assert refused.code == 1
    assert (
        f"server.flight: 127.0.0.1:{port.group(1)} is also server.http's address "
        f"(127.0.0.1:{port.group(1)}): the two servers cannot share a port"
    ) in refused.err

    # The example's placeholder host: a warning (it may resolve only on the cluster's hosts).
    placeholder = copy_config(config, "placeholder.toml")
    edit(placeholder, r"^\[server\]$", '[server]\nadvertise = "ch-node-1.invalid"')
    warned = hakafka("config", "check", "--config", str(placeholder))
    assert warned.code == 0, warned.err
    assert (
        f"{placeholder}: warning: server.advertise = 'ch-node-1.invalid' does not resolve here"
    ) in warned.out

    # A data_dir that is a file, and one that cannot be made.
    (tmp_path / "a-file").write_text("")
    for data_dir, problem in (
        (tmp_path / "a-file", "is not a directory"),
        (
            tmp_path / "a-file" / "data",
            f"cannot be created: {tmp_path / 'a-file'} is not a directory",
        ),
    ):
        bad = copy_config(config, "bad-data-dir.toml")
        edit(bad, r"^data_dir = .*$", f'data_dir = "{data_dir}"')
        failed = hakafka("config", "check", "--config", str(bad))
        assert failed.code == 1
        assert f"data_dir: {data_dir} {problem}" in failed.err


def test_unreachable_services_and_unknown_nodes_fail_in_one_line(
    make_cluster: Any, stack: StackEndpoints, hakafka: Any, zk_root: str, topic_prefix: str
) -> None:
    cluster: LocalCluster = make_cluster({"n1": [0, 1]})
    config = cluster.nodes["n1"].config_path
    dead = free_port()  # nothing listens there

    no_clickhouse = copy_config(config, "no-clickhouse.toml")
    edit(no_clickhouse, r'^"n1" = "[^"]+"$', f'"n1" = "127.0.0.1:{dead}"', count=2)
    edit(no_clickhouse, r"^root = .*$", f'root = "{zk_root}-no-clickhouse"')  # its own record
    line = one_line(hakafka("init", "--config", str(no_clickhouse)))
    assert line == f"hakafka: clickhouse n1 (127.0.0.1:{dead}): cannot connect: Connection refused"

    # The first run of init on this root records the settings, and says so.
    first = hakafka("init", "--config", str(config))
    assert first.code == 0, first.err
    assert (
        f"zookeeper: shard-wide settings recorded in {zk_root}/settings (nothing was recorded)"
        in first.out
    )

    no_zookeeper = copy_config(config, "no-zookeeper.toml")
    edit(no_zookeeper, r"^hosts = .*$", f'hosts = "127.0.0.1:{dead}"\nconnect_timeout = 2.0')
    for command in ("status", "init"):
        line = one_line(hakafka(command, "--config", str(no_zookeeper)))
        assert line.startswith("hakafka: ") and f"127.0.0.1:{dead}" in line, line
    debug = hakafka("status", "--config", str(no_zookeeper), "--debug")
    assert debug.code == 1 and "Traceback" in debug.err

    # node replace: a node nobody knows is refused, naming the ones that exist.
    unknown = one_line(hakafka("node", "replace", "--config", str(config), "n9", "--start"))
    assert unknown == (
        "hakafka: node n9 is unknown: registered now: none; all known: n1; nothing flagged"
    )
    # n1 is the only ClickHouse replica of both shards: flagging it stops every flush.
    only = one_line(hakafka("node", "replace", "--config", str(config), "n1", "--start"))
    assert only == (
        "hakafka: flagging n1 leaves no writable ClickHouse replica for shard 0 (replicas: "
        "n1); shard 1 (replicas: n1): its flushes would fail until `--done`; add a replica "
        "first, or --force; nothing flagged"
    )
    status = json.loads(hakafka("status", "--config", str(config), "--json").out)
    assert [n["replacing"] for n in status["nodes"]] == [None]
    forced = hakafka("node", "replace", "--config", str(config), "n1", "--start", "--force")
    assert forced.code == 0, forced.err
    done = hakafka("node", "replace", "--config", str(config), "n1", "--done")
    assert done.code == 0 and "no longer under replacement" in done.out

    # offsets set --to-timestamp with a mistyped year: every partition would go to its end.
    topic = f"{topic_prefix}_events"
    create_topic(stack.kafka, topic, 2)
    produce(stack.kafka, topic, 40, partitions=2)
    moved = hakafka(
        "offsets", "set", "--config", str(config), "--shard", "0", "--pipeline", "events",
        "--to-timestamp", "2030-01-01T00:00:00Z",
    )  # fmt: skip
    line = one_line(moved)
    assert line.startswith(
        "hakafka: --to-timestamp 2030-01-01T00:00:00.000Z is after the newest message of every "
        "partition (p0 20"
    ), line
    assert line.endswith(
        "): each would move to its end, skipping every message not yet in ClickHouse; "
        "--to-latest says so, --allow-end does it anyway; nothing changed"
    )
    shown = hakafka("offsets", "show", "--config", str(config), "--shard", "0", "--json")
    assert [(r["checkpoint"], r["paused"]) for r in json.loads(shown.out)] == [(None, False)]
    drop = ["pending", "drop", "--config", str(config), "--shard", "0", "--pipeline", "events"]
    nothing = one_line(hakafka(*drop, "--dry-run"))
    assert nothing == "hakafka: shard 0, pipeline events: no block is pending"


def test_failover_to_a_node_that_cannot_consume_says_it_leads_and_why(
    make_cluster: Any, hakafka: Any
) -> None:
    cluster: LocalCluster = make_cluster({"n1": [0], "n2": [0]})
    config = str(cluster.nodes["n1"].config_path)
    assert hakafka("init", "--config", config).code == 0
    cluster.nodes["n1"].start()
    assert cluster.wait_leaders([0]) == {0: "n1"}
    # n2's recovery hangs after the WAL replay, as on a hung disk: it is elected, never consumes.
    cluster.nodes["n2"].start(env={"HAKAFKA_HANG_AT": "recover.after_replay"})
    cluster.nodes["n2"].wait_up(90)
    moved = hakafka("failover", "--config", config, "--shard", "0", "--to", "n2", "--wait", "10")
    line = one_line(moved)
    assert re.fullmatch(
        r"hakafka: shard 0: n2 leads it \(epoch \d+\) but does not consume yet \(its status: "
        r"elected\): pipeline events: recovering[^;]*; check `hakafka status` and n2's log",
        line,
    ), line
    cluster.nodes["n2"].kill(signal.SIGKILL)  # its hung recovery would hold a clean stop


def test_status_names_the_pause_and_a_token_it_lacks(
    make_cluster: Any, stack: StackEndpoints, hakafka: Any, topic_prefix: str
) -> None:
    create_topic(stack.kafka, f"{topic_prefix}_events", 2)
    cluster: LocalCluster = make_cluster({"n1": [0, 1]}, server={"token": "first-hour"})
    config = cluster.nodes["n1"].config_path
    assert hakafka("init", "--config", str(config)).code == 0
    cluster.start()
    cluster.wait_leaders([0, 1])
    paused = hakafka(
        "pipeline", "pause", "--config", str(config), "--pipeline", "events", "--shard", "1",
        "--reason", "backfill",
    )  # fmt: skip
    assert paused.code == 0, paused.err
    who = f"{getpass.getuser()}@{socket.gethostname()}"

    status = hakafka("status", "--config", str(config))
    assert status.code == 0, status.err
    shards = {line.split()[0]: line for line in status.out.splitlines()[1:3]}
    assert "consuming" in shards["0"] and "paused" not in shards["0"]
    assert "consuming, events paused" in shards["1"]
    (row,) = [line for line in status.out.splitlines() if line.split()[:2] == ["1", "events"]]
    assert f"paused by {who} since " in row and "): backfill" in row
    (node,) = [line for line in status.out.splitlines() if line.startswith("n1 ")]
    # ALIVE, HEALTHY (one vocabulary), LEADS
    assert node.split()[1:4] == ["yes", "yes", "2"]

    # A query naming the paused pipeline says so; --partial answers from the other shard.
    query = hakafka("query", "--config", str(config), "SELECT count(*) AS n FROM events")
    line = one_line(query)
    assert line.startswith(f"hakafka: shard 1: pipeline events is paused (by {who} since ")
    assert line.endswith(
        ": backfill); its buffer is served again after `hakafka pipeline resume --pipeline "
        "events --shard 1`; see `hakafka status`; --partial answers from the other shards"
    )
    partial = hakafka(
        "query", "--config", str(config), "--partial", "SELECT count(*) AS n FROM events"
    )
    assert partial.code == 0, partial.err
    assert partial.err.startswith("hakafka: skipped shard 1: shard 1: pipeline events is paused")
    assert partial.out.splitlines()[0].split() == ["shard", "n"]

    # Without the token: every node refuses, and the table says why once, under it.
    tokenless = copy_config(config, "tokenless.toml")
    edit(tokenless, r'^token = "first-hour"$', "")
    refused = hakafka("status", "--config", str(tokenless))
    assert refused.code == 1
    assert refused.out.count("HTTP 401") == 1
    assert "unauthorized (see below)" in refused.out
    assert refused.out.rstrip().endswith(
        "n1 refused this command's token (HTTP 401): set [server] token_file (or "
        "HAKAFKA_SERVER_TOKEN) in this config to the token the nodes use"
    )
