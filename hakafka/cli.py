"""The `hakafka` command: one entry point, one subcommand per operator task."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import traceback
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from hakafka import __version__
from hakafka.config import (
    DEFAULT_PATH,
    Config,
    ConfigError,
    advertise_warning,
    check_data_dir,
    load_config,
)

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2

FORMATS = ("table", "json", "csv", "arrow")
WAIT_S = 60.0  # --wait of every command that waits, but `query`
DEBUG_HELP = "on failure print the traceback; print the libraries' log lines (kazoo, librdkafka)"


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


def _config_check(args: argparse.Namespace) -> int:
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


def _run(args: argparse.Namespace) -> int:
    from hakafka import logs

    def read() -> Config:
        config = load_with_table_columns(args.config)
        if args.log_level is None:
            return config
        return dataclasses.replace(config, log_level=logs.LogLevel(args.log_level))

    config = read()
    check_data_dir(config)
    sink = logs.configure(args.log_format, config.log_level, logs.LogSink(args.log_file))
    # Only `run` loads the daemon (and with it Spark).
    from hakafka.daemon import Daemon, StartupError

    try:
        return Daemon(config, sink, reload=read).run()
    except StartupError as exc:
        print(f"hakafka: {exc}", file=sys.stderr)
        return EXIT_FAILURE


def _init(args: argparse.Namespace) -> int:
    from hakafka.ops.init import initialize
    from hakafka.ops.shardwide import Recording

    how = Recording.AGREE
    if args.update or args.replace:
        how = Recording.UPDATE if args.update else Recording.REPLACE
    for line in initialize(load_with_table_columns(args.config), how, args.distributed):
        print(line)
    return EXIT_OK


def _print_json(value: object) -> None:
    print(json.dumps(value, indent=2, default=str))


def _status(args: argparse.Namespace) -> int:
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


def _failover(args: argparse.Namespace) -> int:
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
        )
    if args.json:
        _print_json(asdict(handover))
    else:
        print(describe(handover))
    return EXIT_OK


def _reshard(args: argparse.Namespace) -> int:
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


def _replace(args: argparse.Namespace) -> int:
    from hakafka.ops import replace
    from hakafka.ops.cluster import connect, operator
    from hakafka.ops.status import diagnosis

    config = load(args.config)
    with connect(config) as coordinator:
        if args.done:
            was_flagged = replace.done(coordinator, args.node)
            if args.json:
                _print_json({"node": args.node, "cleared": was_flagged})
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


def _query(args: argparse.Namespace) -> int:
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


def _pipeline(args: argparse.Namespace) -> int:
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


def _offsets(args: argparse.Namespace) -> int:
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
            _print_json([{**asdict(r), "lag": r.lag} for r in rows])
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


def _offset_target(args: argparse.Namespace) -> Any:
    from hakafka.ops.offsets import OffsetTarget, TargetKind, parse_offsets, parse_timestamp

    if args.to_earliest:
        return OffsetTarget(TargetKind.EARLIEST)
    if args.to_latest:
        return OffsetTarget(TargetKind.LATEST)
    if args.to_timestamp is not None:
        return OffsetTarget(TargetKind.TIMESTAMP, timestamp_ms=parse_timestamp(args.to_timestamp))
    return OffsetTarget(TargetKind.OFFSETS, offsets=parse_offsets(args.to_offset))


def _pending(args: argparse.Namespace) -> int:
    from hakafka.ops import offsets, pause
    from hakafka.ops.cluster import check_shard, connect, operator

    config = load(args.config)
    with connect(config) as coordinator:
        if args.action == "show":
            names = pause.pipeline_names(config, args.pipeline)
            found = offsets.show_pending(coordinator, pause.shards_of(config, args.shard), names)
            if args.json:
                _print_json([{"shard": s, "pipeline": n, **asdict(i)} for s, n, i in found])
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


def _wal(args: argparse.Namespace) -> int:
    from hakafka.ops.wal import check

    return check(load(args.config), args.action, args.pipeline, sys.stdout)


def _add_config(parser: argparse.ArgumentParser) -> None:
    """`--config` (and `--debug`), which every command but `config check` takes."""
    parser.add_argument(
        "--config", type=Path, default=DEFAULT_PATH, help=f"config file (default {DEFAULT_PATH})"
    )
    _add_debug(parser)


def _add_debug(parser: argparse.ArgumentParser) -> None:
    """`--debug` after the command, the same as before it."""
    # SUPPRESS: given after the command or not at all, the top-level --debug stands.
    parser.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=DEBUG_HELP)


def _add_json(parser: argparse.ArgumentParser, text: str = "print JSON (for scripts)") -> None:
    """`--json`: the command prints JSON instead of text; `text` is its help."""
    parser.add_argument("--json", action="store_true", help=text)


def _add_pipeline(
    parser: argparse.ArgumentParser,
    text: str | None = "only this pipeline",
    *,
    required: bool = False,
) -> None:
    """`--pipeline`: the pipeline the command acts on (`required`), or only this one of
    the config's pipelines; `text` is its help."""
    parser.add_argument("--pipeline", required=required, help=text)


def _add_shard(
    parser: argparse.ArgumentParser, text: str | None = "only this shard", *, required: bool = False
) -> None:
    """`--shard` (an int): the shard the command acts on (`required`), or only this one of the
    cluster's shards; `text` is its help."""
    parser.add_argument("--shard", type=int, required=required, help=text)


def _add_wait(
    parser: argparse.ArgumentParser,
    purpose: str,
    *,
    default: float | None = WAIT_S,
    default_text: str = f"default {WAIT_S:g}",
) -> None:
    """`--wait SECONDS`, a float: its help is `purpose` followed by `default_text`."""
    parser.add_argument(
        "--wait", type=float, default=default, metavar="SECONDS", help=f"{purpose} ({default_text})"
    )


def _add_reason(parser: argparse.ArgumentParser, default: str, recorded_with: str) -> None:
    """`--reason`, recorded in ZooKeeper with `recorded_with` (the mark, the pause)."""
    parser.add_argument("--reason", default=default, help=f"recorded with the {recorded_with}")


def _add_dry_run(parser: argparse.ArgumentParser) -> None:
    """`--dry-run`: a checkpoint move printed, nothing changed."""
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print each partition's move and the offsets it skips or re-reads; change nothing",
    )


def _add_ops_commands(commands: Any) -> None:
    status = commands.add_parser(
        "status",
        help="shards, pipelines and nodes of the cluster",
        description="Shards (leader, epoch, since), pipelines on each shard's leader (lag per "
        "partition from the fetch high watermark, buffer rows/bytes, last flush, pending "
        "intent) and nodes (alive, endpoints, replacing). Exit 0 if every shard has a "
        "consuming leader, 1 otherwise.",
    )
    _add_config(status)
    _add_json(status)
    status.set_defaults(handler=_status)

    failover = commands.add_parser(
        "failover",
        help="move a shard's leadership to another node",
        description="Ask the shard's leader to hand over and wait until the new leader "
        "consumes; prints who leads and how long it took. Exit 1 if refused (the reason is "
        "printed) or not done within --wait.",
    )
    _add_config(failover)
    _add_shard(failover, "the shard to move", required=True)
    failover.add_argument("--to", metavar="NODE", help="the node that should lead it")
    _add_wait(failover, "give up after")
    _add_json(failover)
    failover.set_defaults(handler=_failover)

    reshard = commands.add_parser(
        "reshard",
        help="move the running cluster to the shard layout of --config (shard_count, partitions)",
        description="Every leader commits what it holds and pauses; each partition's "
        "checkpoint moves to the shard that owns it in the new layout and the layout is "
        "recorded, in one ZooKeeper multi-op; then nodes configured with the new layout "
        "lead (deploy it to the nodes before or after). Prints each partition's move. "
        "Anything short of the move aborts: the old layout consumes again. Exit 1 then.",
    )
    _add_config(reshard)
    reshard.add_argument(
        "--timeout",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="wait this long for every shard to drain (default 300)",
    )
    reshard.add_argument(
        "--abort", action="store_true", help="end a reshard in progress without moving anything"
    )
    reshard.set_defaults(handler=_reshard)

    node = commands.add_parser("node", help="node maintenance")
    node_commands = node.add_subparsers(dest="node_command", required=True, metavar="ACTION")
    replace = node_commands.add_parser(
        "replace",
        help="mark or clear a node under replacement",
        description="--start: the node leaves every election (its shards move to other "
        "nodes; the command waits until they consume and prints where they went) and gets "
        "no flushes. --done: it is eligible again.",
    )
    _add_config(replace)
    replace.add_argument("node", metavar="NODE")
    mode = replace.add_mutually_exclusive_group(required=True)
    mode.add_argument("--start", action="store_true", help="mark NODE under replacement")
    mode.add_argument("--done", action="store_true", help="clear the mark")
    _add_reason(replace, "replacement", "mark")
    replace.add_argument(
        "--force",
        action="store_true",
        help="--start even when a shard is left without a ClickHouse replica that takes "
        "flushes (they fail until --done)",
    )
    _add_wait(replace, "how long --start waits for each moved shard")
    _add_json(replace)
    replace.set_defaults(handler=_replace)

    query = commands.add_parser(
        "query",
        help="SQL over the memory buffers of shard leaders",
        description="Run SQL on the buffer of the shard's current leader (found in "
        "ZooKeeper). Without --shard every shard is queried and the results concatenated in "
        "shard order: an aggregate gives one row per shard (a first column `shard` says "
        "which, in table output). The buffer speaks DuckDB's SQL dialect, not ClickHouse's: "
        'quote a column named like a keyword in double quotes (SELECT "at" FROM events); '
        "each pipeline is a table, with `_partition`, `_offset` and `_shard` columns.",
    )
    _add_config(query)
    query.add_argument("sql", metavar="SQL", help='e.g. "SELECT count(*) FROM events"')
    _add_shard(query)
    query.add_argument("--format", choices=FORMATS, default="table", help="output format")
    _add_json(query, "same as --format json")
    _add_wait(
        query,
        "how long to wait for a shard's next leader when it has none or its leader does not answer",
        default=None,
        default_text="default: zookeeper.session_timeout + 2",
    )
    query.add_argument(
        "--partial",
        action="store_true",
        help="answer from the shards whose leader answers; name the skipped ones on stderr",
    )
    query.set_defaults(handler=_query)

    _add_pipeline_commands(commands)

    wal = commands.add_parser(
        "wal",
        help="inspect or verify this node's WAL",
        description="Scan this node's WAL directories read-only (data_dir/wal/SHARD/PIPELINE). "
        "Exit 1 if a log is damaged.",
    )
    wal.add_argument("action", choices=("inspect", "verify"))
    _add_config(wal)
    _add_pipeline(wal)
    wal.set_defaults(handler=_wal)


def _add_pipeline_commands(commands: Any) -> None:
    """`pipeline pause|resume`, `offsets show|set`, `pending show|drop`."""
    stopped = "how long to wait for the shard's leader to stop the pipeline"
    pipeline = commands.add_parser("pipeline", help="pause or resume a pipeline")
    actions = pipeline.add_subparsers(dest="action", required=True, metavar="ACTION")
    for action, text in (
        ("pause", "stop consuming and flushing; held in ZooKeeper, so a new leader honours it"),
        ("resume", "consume again from the checkpoint (and the WAL)"),
    ):
        sub = actions.add_parser(action, help=text, description=text)
        _add_config(sub)
        _add_pipeline(sub, None, required=True)
        _add_shard(sub, "only this shard (default: every shard)")
        if action == "pause":
            _add_reason(sub, "no reason given", "pause")
            _add_wait(sub, stopped)
        _add_json(sub)
        sub.set_defaults(handler=_pipeline)

    offsets = commands.add_parser(
        "offsets", help="see or move a pipeline's checkpoint (where it resumes)"
    )
    actions = offsets.add_subparsers(dest="action", required=True, metavar="ACTION")
    show = actions.add_parser(
        "show",
        help="checkpoint, Kafka watermarks, lag and pending block per partition",
        description="Per partition of each shard: the checkpoint in ZooKeeper (the next "
        "offset to write to ClickHouse), the broker's low and high watermarks, the lag from the "
        "checkpoint, the pending block's offsets, and whether the pipeline is paused.",
    )
    _add_config(show)
    _add_pipeline(show)
    _add_shard(show)
    _add_json(show)
    show.set_defaults(handler=_offsets)
    move = actions.add_parser(
        "set",
        help="move a shard's pipeline to other offsets (replay or skip)",
        description="Pause the pipeline (unless paused already), wait until its leader "
        "stopped it, write the new checkpoint fenced by that leader's epoch, and resume it. "
        "Refused while a block is pending (a flush in doubt) unless --drop-pending. Rows "
        "consumed but not yet flushed below the new offsets are not written; offsets at or "
        "above them are consumed again. Prints every partition's move.",
    )
    _add_config(move)
    _add_pipeline(move, None, required=True)
    _add_shard(move, None, required=True)
    to = move.add_mutually_exclusive_group(required=True)
    to.add_argument("--to-earliest", action="store_true", help="each partition's log start")
    to.add_argument("--to-latest", action="store_true", help="each partition's end (skip all)")
    to.add_argument(
        "--to-timestamp",
        metavar="TIME",
        help="the first offset at or after TIME (ISO-8601, UTC if no offset; or epoch ms)",
    )
    to.add_argument("--to-offset", metavar="P:O,...", help="these partitions to these offsets")
    move.add_argument(
        "--drop-pending", action="store_true", help="abandon a pending block (printed)"
    )
    move.add_argument(
        "--allow-end",
        action="store_true",
        help="with --to-timestamp: move even when TIME is after every partition's newest "
        "message (every partition to its end; refused without it)",
    )
    _add_wait(move, stopped)
    _add_dry_run(move)
    move.set_defaults(handler=_offsets)

    pending = commands.add_parser("pending", help="see or drop a pipeline's pending block")
    actions = pending.add_subparsers(dest="action", required=True, metavar="ACTION")
    show = actions.add_parser("show", help="the blocks in doubt: offsets, rows, dead letters")
    _add_config(show)
    _add_pipeline(show)
    _add_shard(show)
    _add_json(show)
    show.set_defaults(handler=_pending)
    drop = actions.add_parser(
        "drop",
        help="abandon a shard's pending block: its offsets are skipped",
        description="Pause the pipeline, wait until its leader stopped it, move the "
        "checkpoint past the pending block and delete it (one fenced write), resume. Prints "
        "the rows abandoned; a flush attempt may already have written some of them.",
    )
    _add_config(drop)
    _add_pipeline(drop, None, required=True)
    _add_shard(drop, None, required=True)
    _add_wait(drop, stopped)
    _add_dry_run(drop)
    drop.set_defaults(handler=_pending)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = argparse.ArgumentParser(
        prog="hakafka",
        description="High-availability Kafka -> ClickHouse ingestion daemon.",
    )
    parser.add_argument("--version", action="version", version=f"hakafka {__version__}")
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = commands.add_parser("run", help="run the daemon (what the systemd unit starts)")
    _add_config(run)
    run.add_argument(
        "--log-format", choices=("json", "console"), default="json", help="log line format"
    )
    run.add_argument(
        "--log-level",
        choices=("debug", "info", "warning", "error"),
        help="overrides the config's log_level (then a reload does not change it)",
    )
    run.add_argument(
        "--log-file",
        type=Path,
        default=None,
        help="log to this file (SIGHUP reopens it) instead of stdout",
    )
    run.set_defaults(handler=_run)

    config = commands.add_parser("config", help="configuration tools")
    config_commands = config.add_subparsers(dest="config_command", required=True, metavar="ACTION")
    check = config_commands.add_parser(
        "check", help="validate a config file; print every problem with its key"
    )
    check.add_argument(
        "file", type=Path, nargs="?", default=None, help=f"the config file (default {DEFAULT_PATH})"
    )
    check.add_argument(
        "--config", dest="config_given", type=Path, help="the config file (same as FILE)"
    )
    _add_debug(check)
    check.add_argument(
        "--cluster",
        action="store_true",
        help="also compare the shard-wide settings with those recorded in ZooKeeper: print "
        "each difference (key, recorded value, this config's value, compatible or not); "
        "exit 1 if any",
    )
    check.set_defaults(handler=_config_check)

    init = commands.add_parser(
        "init",
        help="create the ZooKeeper paths and ClickHouse tables and record the shard-wide "
        "settings (idempotent)",
    )
    _add_config(init)
    recording = init.add_mutually_exclusive_group()
    recording.add_argument(
        "--update",
        action="store_true",
        help="record this config's shard-wide settings when every difference from the record "
        "is compatible (a pipeline or a Nullable column added); running nodes with other "
        "settings step down until restarted with this config",
    )
    recording.add_argument(
        "--replace",
        action="store_true",
        help="record this config's shard-wide settings whatever differs; refused while any "
        "node runs or a block is pending (the last step of a migration)",
    )
    init.add_argument(
        "--distributed",
        metavar="CLUSTER",
        help="also create <table>_all, a Distributed table over every shard's table, on every "
        "replica: CLUSTER is its name in the ClickHouse servers' remote_servers",
    )
    init.set_defaults(handler=_init)
    _add_ops_commands(commands)

    return parser


def _logs_to_stderr(debug: bool) -> None:
    """Operator commands keep stdout for their results (JSON, CSV, Arrow): the log events of
    the code they call go to stderr, warnings and errors only. The libraries' own log lines
    (kazoo's "Connection dropped" on every retry, librdkafka's) are debug output: with
    `debug`, every event and library line is printed; without, none of the libraries'.

    The one logging setup of an operator command's process; `run` has `logs.configure`
    instead (in `_run`, once its config is read), never both."""
    import logging

    import structlog

    level = logging.DEBUG if debug else logging.WARNING
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.dev.ConsoleRenderer(colors=False),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
    )
    root = logging.getLogger()
    # A handler on the root keeps Python's last-resort stderr handler from printing them.
    root.addHandler(logging.StreamHandler(sys.stderr) if debug else logging.NullHandler())
    root.setLevel(level)


def _one_line(exc: BaseException) -> str:
    """`exc` as one line: its type and the first line of its text."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}".rstrip(": ")


def main(argv: Sequence[str] | None = None) -> int:
    """Run one `hakafka` command; return its exit code (0 ok, 1 failure, 2 usage)."""
    from buffer.client import QueryFailedError
    from hakafka.consumer import ConsumerError
    from hakafka.coordination import CoordinationError
    from hakafka.ops.cluster import OpsError, UsageError

    args = build_parser().parse_args(argv)
    operator_command = args.handler is not _run
    if operator_command:
        _logs_to_stderr(args.debug)
    try:
        code: int = args.handler(args)
    except UsageError as exc:
        print(f"hakafka: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (ConfigError, OpsError, CoordinationError, QueryFailedError, ConsumerError) as exc:
        if args.debug:
            traceback.print_exc()
        print(f"hakafka: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except Exception as exc:
        if args.debug or not operator_command:
            raise
        print(
            f"hakafka: {args.command} failed: {_one_line(exc)} (--debug prints the traceback)",
            file=sys.stderr,
        )
        return EXIT_FAILURE
    return code


if __name__ == "__main__":
    sys.exit(main())
