"""The `hakafka` command: one entry point, one subcommand per operator task.

Here: every command's arguments (an option several commands share declared once), `run`,
the one logging setup of a process and the exit code of each failure. What an operator
command does and prints is its handler's, in `hakafka.ops.handlers`."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from buffer.push_bounds import MAX_ROWS, MAX_SEQUENCE
from hakafka import __version__, logs
from hakafka.config import DEFAULT_PATH, Config, ConfigError, check_data_dir
from hakafka.ops import handlers
from hakafka.ops.handlers import (
    EXIT_FAILURE,
    EXIT_USAGE,
    clickhouse_type_problem,
    load_with_table_columns,
)
from hakafka.ops.push import FileFormat

# `clickhouse_type_problem` too: tests/consumer read configs with the check every command uses.
__all__ = ["build_parser", "clickhouse_type_problem", "main"]

FORMATS = ("table", "json", "csv", "arrow")
WAIT_S = 60.0  # --wait of every command that waits, but `query`
DEBUG_HELP = "on failure print the traceback; print the libraries' log lines (kazoo, librdkafka)"


def _run(args: argparse.Namespace) -> int:
    """`run`: the daemon, until it stops (its exit code), with logging set up for it."""

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


def _at_least(low: int, high: int) -> Any:
    """An argparse type: an int within `low`..`high`."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is not within {low}..{high}")
        return value

    return parse


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
    status.set_defaults(handler=handlers.status_command)

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
    failover.add_argument(
        "--hold",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="keep the shard on --to this long: leadership balance leaves it (default 0: "
        "no hold; the next failover of the shard replaces it)",
    )
    _add_wait(failover, "give up after")
    _add_json(failover)
    failover.set_defaults(handler=handlers.failover_command)

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
    reshard.set_defaults(handler=handlers.reshard_command)

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
    replace.set_defaults(handler=handlers.node_replace_command)

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
    query.set_defaults(handler=handlers.query_command)

    push = commands.add_parser(
        "push",
        help="push a file's rows into a pipeline's buffer (CSV, JSONEachRow, Arrow)",
        description="Push FILE's rows into the pipeline's buffer on the shard's leader, in "
        "batches of --batch-rows, each acknowledged once flushed to ClickHouse. Batch k is "
        "sequence --first-sequence + k of the writer (named after the file unless --writer "
        "says): the same command run again after a failure pushes the same batches, and "
        "those applied before are not applied again. Progress goes to stderr.",
    )
    _add_config(push)
    push.add_argument("file", metavar="FILE", type=Path, help="the rows to push")
    _add_pipeline(push, "the pipeline whose buffer takes the rows", required=True)
    _add_shard(push, "the shard whose leader takes them (default 0)")
    push.add_argument(
        "--format", choices=[str(f) for f in FileFormat], help="default: from the extension"
    )
    push.add_argument("--writer", help="the writer id (default: push-<digest of the path>)")
    push.add_argument(
        "--batch-rows",
        type=_at_least(1, MAX_ROWS),
        default=10_000,
        metavar="N",
        help="rows per batch (default 10000)",
    )
    push.add_argument(
        "--first-sequence",
        type=_at_least(0, MAX_SEQUENCE),
        default=0,
        metavar="N",
        help="the first batch's sequence (default 0)",
    )
    _add_wait(
        push,
        "how long one batch may wait for a leader that takes it",
        default=120.0,
        default_text="default 120",
    )
    push.set_defaults(handler=handlers.push_command)

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
    wal.set_defaults(handler=handlers.wal_command)


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
        sub.set_defaults(handler=handlers.pipeline_command)

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
    show.set_defaults(handler=handlers.offsets_command)
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
    move.set_defaults(handler=handlers.offsets_command)

    pending = commands.add_parser("pending", help="see or drop a pipeline's pending block")
    actions = pending.add_subparsers(dest="action", required=True, metavar="ACTION")
    show = actions.add_parser("show", help="the blocks in doubt: offsets, rows, dead letters")
    _add_config(show)
    _add_pipeline(show)
    _add_shard(show)
    _add_json(show)
    show.set_defaults(handler=handlers.pending_command)
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
    drop.set_defaults(handler=handlers.pending_command)


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
    check.set_defaults(handler=handlers.config_check_command)

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
    init.set_defaults(handler=handlers.init_command)
    _add_ops_commands(commands)

    return parser


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
        logs.configure_stderr(args.debug)
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
