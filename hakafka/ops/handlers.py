"""The operator commands as `hakafka.cli` runs them, one handler per command: each reads
the config named on the command line, calls its command family's module, prints what that
module's describer makes of the result and returns the exit code.

Each handler imports its family's modules itself, so a command loads only what it uses
(`tests/test_cli_imports.py`). The config as every command reads it (`load`,
`load_with_table_columns`) is here too: `hakafka run` reads it the same way.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from hakafka.config import (
    DEFAULT_PATH,
    Config,
    advertise_warning,
    check_data_dir,
    load_config,
)

if TYPE_CHECKING:
    from hakafka.ops.offsets import OffsetTarget

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2


def clickhouse_type_problem(ch_type: str) -> str | None:
    """None if hakafka can decode into `ch_type`, else what is wrong with it."""
    from hakafka.consumer import SchemaError, arrow_type

    try:
        arrow_type(ch_type)
    except SchemaError as exc:
        return str(exc)
    return None


def load(path: Path) -> Config:
    """The validated config at `path` (ConfigError lists every problem)."""
    return load_config(path, clickhouse_type_problem)


def load_with_table_columns(path: Path) -> Config:
    """`load`, with the columns of each `columns = "from_table"` pipeline read from its
    ClickHouse table (ConfigError if that fails)."""
    from hakafka.table_columns import with_table_columns

    return with_table_columns(load(path))


def _print_json(value: object) -> None:
    """`value` on stdout as indented JSON (what `--json` prints), values JSON has no type for
    (datetimes, enums) as their text."""
    print(json.dumps(value, indent=2, default=str))


def config_check_command(args: argparse.Namespace) -> int:
    """`config check`: the config valid (else ConfigError), and with `--cluster` its shard-wide
    settings the same as the record in ZooKeeper (exit 1 if not)."""
    from hakafka.ops.cluster import UsageError

    if args.file is not None and args.config_given is not None and args.file != args.config_given:
        raise UsageError(f"two config files named: {args.file} and --config {args.config_given}")
    path = args.file or args.config_given or DEFAULT_PATH
    config = load(path)
    check_data_dir(config)
    print(
        f"{path}: ok (node {config.node}, shards {list(config.shards)} of "
        f"{config.shard_count}, pipelines {', '.join(p.name for p in config.pipelines)})"
    )
    if (warning := advertise_warning(config)) is not None:
        print(f"{path}: warning: {warning}")
    if not args.cluster:
        return EXIT_OK
    from hakafka.ops.cluster import connect
    from hakafka.ops.shardwide import cluster_check
    from hakafka.table_columns import with_table_columns

    config = with_table_columns(config)
    with connect(config) as coordinator:
        lines, agreed = cluster_check(coordinator, config)
    print("\n".join(lines))
    return EXIT_OK if agreed else EXIT_FAILURE


def init_command(args: argparse.Namespace) -> int:
    """`init`: the ZooKeeper layout, the shard-wide settings record and the tables."""
    from hakafka.ops.init import initialize
    from hakafka.ops.shardwide import Recording

    how = Recording.AGREE
    if args.update or args.replace:
        how = Recording.UPDATE if args.update else Recording.REPLACE
    for line in initialize(load_with_table_columns(args.config), how, args.distributed):
        print(line)
    return EXIT_OK


def status_command(args: argparse.Namespace) -> int:
    """`status`: exit 0 if every shard has a consuming leader, else 1."""
    from hakafka.ops.cluster import connect
    from hakafka.ops.status import cluster_status, render

    config = load(args.config)
    with connect(config) as coordinator:
        status = cluster_status(coordinator, config)
    if args.json:
        _print_json(status)
    else:
        print(render(status))
    return EXIT_OK if status["healthy"] else EXIT_FAILURE


def failover_command(args: argparse.Namespace) -> int:
    """`failover`: the shard's leadership handed over (else OpsError)."""
    from hakafka.ops.cluster import check_shard, connect, operator
    from hakafka.ops.failover import describe, failover
    from hakafka.ops.status import diagnosis

    config = load(args.config)
    shard = check_shard(config, args.shard)
    with connect(config) as coordinator:
        handover = failover(
            coordinator,
            shard,
            to=args.to,
            wait_s=args.wait,
            by=operator(),
            diagnose=diagnosis(coordinator, config),
            hold_s=args.hold,
        )
    if args.json:
        _print_json(asdict(handover))
    else:
        print(describe(handover))
    return EXIT_OK


def reshard_command(args: argparse.Namespace) -> int:
    """`reshard`: the cluster moved to the config's layout, each step printed as it goes (or
    with `--abort`, the reshard in progress ended)."""
    from hakafka.ops.cluster import connect, operator
    from hakafka.ops.reshard import describe, describe_abort, reshard

    config = load(args.config)
    with connect(config) as coordinator:
        if args.abort:
            print(describe_abort(coordinator.reshard.abort()))
            return EXIT_OK
        moves = reshard(
            coordinator,
            config,
            by=operator(),
            timeout=args.timeout,
            progress=lambda line: print(line, flush=True),
        )
    print(describe(moves, config.shard_count))
    return EXIT_OK


def node_replace_command(args: argparse.Namespace) -> int:
    """`node replace`: the node marked (`--start`, its shards moved away) or cleared."""
    from hakafka.ops import replace
    from hakafka.ops.cluster import connect, operator
    from hakafka.ops.status import diagnosis

    config = load(args.config)
    with connect(config) as coordinator:
        if args.done:
            was_flagged = replace.done(coordinator, args.node)
            if args.json:
                _print_json(replace.done_json(args.node, cleared=was_flagged))
            else:
                print(replace.describe_done(args.node, cleared=was_flagged))
            return EXIT_OK
        result = replace.start(
            coordinator,
            config,
            args.node,
            reason=args.reason,
            wait_s=args.wait,
            by=operator(),
            force=args.force,
            diagnose=diagnosis(coordinator, config),
        )
    if args.json:
        _print_json(asdict(result))
    else:
        print(replace.describe(result))
    return EXIT_OK


def query_command(args: argparse.Namespace) -> int:
    """`query`: the result on stdout in the format asked for; skipped shards and notes on
    stderr."""
    from hakafka.ops.cluster import check_shard, connect
    from hakafka.ops.query import query_shards, render
    from hakafka.settings import client_tls

    config = load(args.config)
    shards = (
        [check_shard(config, args.shard)] if args.shard is not None else range(config.shard_count)
    )
    wait = args.wait if args.wait is not None else config.zookeeper.session_timeout + 2.0
    with connect(config) as coordinator:
        answer = query_shards(
            coordinator,
            list(shards),
            args.sql,
            token=config.server.token.value or None,
            tls=client_tls(config),
            wait_s=wait,
            partial=args.partial,
        )
    for shard, why in answer.skipped.items():
        print(f"hakafka: skipped shard {shard}: {why}", file=sys.stderr)
    for note in answer.notes:
        print(f"hakafka: {note}", file=sys.stderr)
    fmt = "json" if args.json else args.format
    several = len(shards) > 1 and fmt == "table"  # asked of several: say which answered
    sys.stdout.buffer.write(render(answer.labelled() if several else answer.table, fmt))
    sys.stdout.flush()
    return EXIT_OK


def push_command(args: argparse.Namespace) -> int:
    """`push`: a file's rows into a pipeline's buffer on the shard's leader; progress on
    stderr, the outcome on stdout."""
    import time

    from buffer.push_client import Pusher, PushRejectedError, PushUnavailableError
    from hakafka.ops import push
    from hakafka.ops.cluster import OpsError, UsageError, check_shard, connect
    from hakafka.ops.pause import pipeline_name
    from hakafka.settings import client_tls

    config = load(args.config)
    name = pipeline_name(config, args.pipeline)
    shard = check_shard(config, args.shard if args.shard is not None else 0)
    path: Path = args.file
    if not path.is_file():
        raise UsageError(f"{path}: no such file")
    fmt = push.file_format(path, args.format)
    writer = args.writer or push.default_writer(path)
    size = push.file_size(path)
    print(f"hakafka: pushing {path} as writer {writer} into {name}, shard {shard}", file=sys.stderr)
    with connect(config) as coordinator:

        def urls() -> list[str]:
            # The leader first, then the shard's other candidates: each names the leader.
            nodes = coordinator.nodes()
            leader = coordinator.leader_of(shard)
            order = ([leader.node] if leader else []) + coordinator.candidates(shard)
            return [nodes[n].http for n in dict.fromkeys(order) if n in nodes and nodes[n].http]

        pusher = Pusher(
            urls,
            name,
            shard,
            writer,
            token=config.server.token.value or None,
            tls=client_tls(config),
            wait_s=args.wait,
        )
        progress = push.Progress()
        began = time.monotonic()
        try:
            push.push_file(
                pusher,
                push.batches(path, fmt, args.batch_rows, progress),
                progress,
                first_sequence=args.first_sequence,
                report=lambda p, s: print(
                    f"hakafka: {push.describe(p, s, size)}", file=sys.stderr, flush=True
                ),
            )
        except (PushRejectedError, PushUnavailableError) as exc:
            raise OpsError(
                f"batch {progress.batches} (sequence {args.first_sequence + progress.batches}, "
                f"rows from {progress.batches * args.batch_rows}) of {path}: {exc}; "
                f"{progress.batches} batches before it are acknowledged: run the same command "
                "again to go on (they are not applied twice)"
            ) from None
        finally:
            pusher.close()
    print(push.describe(progress, time.monotonic() - began, size))
    return EXIT_OK


def pipeline_command(args: argparse.Namespace) -> int:
    """`pipeline pause|resume`: the pipeline paused (its leaders stopped it) or resumed."""
    from hakafka.ops import pause
    from hakafka.ops.cluster import connect, operator

    config = load(args.config)
    name = pause.pipeline_name(config, args.pipeline)
    shards = pause.shards_of(config, args.shard)
    with connect(config) as coordinator:
        if args.action == "pause":
            outcomes = pause.pause(
                coordinator, shards, name, by=operator(), reason=args.reason, timeout_s=args.wait
            )
        else:
            outcomes = pause.resume(coordinator, shards, name)
    if args.json:
        _print_json([asdict(o) for o in outcomes])
    else:
        print(pause.describe(outcomes, pausing=args.action == "pause"))
    return EXIT_OK


def offsets_command(args: argparse.Namespace) -> int:
    """`offsets show|set`: each partition's offsets printed, or the checkpoint moved."""
    from hakafka.consumer.topic_offsets import TopicOffsets
    from hakafka.ops import offsets, pause
    from hakafka.ops.cluster import check_shard, connect, operator

    config = load(args.config)
    kafka = config.kafka
    if args.action == "show":
        names = pause.pipeline_names(config, args.pipeline)
        readers = {
            n: TopicOffsets(kafka.bootstrap, config.pipeline(n).topic, kafka.settings)
            for n in names
        }
        try:
            with connect(config) as coordinator:
                rows = offsets.show_offsets(
                    coordinator, config, readers, pause.shards_of(config, args.shard), names
                )
        finally:
            for reader in readers.values():
                reader.close()
        if args.json:
            _print_json(offsets.offsets_json(rows))
        else:
            print(offsets.render_offsets(rows))
        return EXIT_OK
    name = pause.pipeline_name(config, args.pipeline)
    shard = check_shard(config, args.shard)
    target = _offset_target(args)
    with (
        TopicOffsets(kafka.bootstrap, config.pipeline(name).topic, kafka.settings) as reader,
        connect(config) as coordinator,
    ):
        move = offsets.set_offsets(
            coordinator,
            config,
            reader,
            shard=shard,
            pipeline=name,
            target=target,
            drop_pending=args.drop_pending,
            by=operator(),
            timeout_s=args.wait,
            dry_run=args.dry_run,
            allow_end=args.allow_end,
        )
    print(offsets.describe_move(move))
    return EXIT_OK


def _offset_target(args: argparse.Namespace) -> OffsetTarget:
    """Where `offsets set` moves to: the one `--to-...` option given."""
    from hakafka.ops.offsets import OffsetTarget, TargetKind, parse_offsets, parse_timestamp

    if args.to_earliest:
        return OffsetTarget(TargetKind.EARLIEST)
    if args.to_latest:
        return OffsetTarget(TargetKind.LATEST)
    if args.to_timestamp is not None:
        return OffsetTarget(TargetKind.TIMESTAMP, timestamp_ms=parse_timestamp(args.to_timestamp))
    return OffsetTarget(TargetKind.OFFSETS, offsets=parse_offsets(args.to_offset))


def pending_command(args: argparse.Namespace) -> int:
    """`pending show|drop`: the pending blocks printed, or one dropped."""
    from hakafka.ops import offsets, pause
    from hakafka.ops.cluster import check_shard, connect, operator

    config = load(args.config)
    with connect(config) as coordinator:
        if args.action == "show":
            names = pause.pipeline_names(config, args.pipeline)
            found = offsets.show_pending(coordinator, pause.shards_of(config, args.shard), names)
            if args.json:
                _print_json(offsets.pending_json(found))
            else:
                print(offsets.describe_pending(found))
            return EXIT_OK
        move = offsets.drop_pending(
            coordinator,
            config,
            shard=check_shard(config, args.shard),
            pipeline=pause.pipeline_name(config, args.pipeline),
            by=operator(),
            timeout_s=args.wait,
            dry_run=args.dry_run,
        )
    print(offsets.describe_move(move))
    return EXIT_OK


def wal_command(args: argparse.Namespace) -> int:
    """`wal inspect|verify`: exit 1 if a log is damaged."""
    from hakafka.ops.wal import check

    return check(load(args.config), args.action, args.pipeline, sys.stdout)
