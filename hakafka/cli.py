"""The `hakafka` command: one entry point, one subcommand per operator task."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from hakafka.config import DEFAULT_PATH, Config, ConfigError, load_config
from hakafka.devstack.process import DevstackError

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2

DEFAULT_DEV_ROOT = Path(".devstack")


def _dev_up(args: argparse.Namespace) -> int:
    from hakafka.devstack.stack import DevStack

    stack = DevStack(args.root)
    began = time.monotonic()
    records = stack.up(zk_members=args.zk_members)
    for r in records:
        print(f"{r.name:<11} pid {r.pid:<8} {r.endpoint}")
    print(f"stack up in {time.monotonic() - began:.1f} s; endpoints in {stack.env_path}")
    return EXIT_OK


def _dev_down(args: argparse.Namespace) -> int:
    from hakafka.devstack.stack import DevStack

    stopped = DevStack(args.root).down()
    for r in stopped:
        print(f"stopped {r.name} (pid {r.pid})")
    if not stopped:
        print("nothing was running")
    return EXIT_OK


def _dev_status(args: argparse.Namespace) -> int:
    from hakafka.devstack.stack import DevStack

    statuses = DevStack(args.root).status()
    if args.json:
        print(json.dumps([asdict(s) for s in statuses], indent=2))
    else:
        if not statuses:
            print(f"no stack recorded under {args.root}")
        for s in statuses:
            state = "healthy" if s.healthy else ("running, unhealthy" if s.running else "stopped")
            print(f"{s.name:<11} pid {s.pid:<8} {s.endpoint:<28} {state}")
    healthy = bool(statuses) and all(s.healthy for s in statuses)
    return EXIT_OK if healthy else EXIT_FAILURE


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


def _config_check(args: argparse.Namespace) -> int:
    config = load(args.file)
    print(
        f"{args.file}: ok (node {config.node}, shards {list(config.shards)} of "
        f"{config.shard_count}, pipelines {', '.join(p.name for p in config.pipelines)})"
    )
    return EXIT_OK


def _run(args: argparse.Namespace) -> int:
    from hakafka import logs

    config = load(args.config)
    sink = logs.configure(args.log_format, args.log_level, logs.LogSink(args.log_file))
    from hakafka.daemon import Daemon

    return Daemon(config, sink).run()


def _init(args: argparse.Namespace) -> int:
    from hakafka.init import initialize

    for line in initialize(load(args.config)):
        print(line)
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = argparse.ArgumentParser(
        prog="hakafka",
        description="High-availability Kafka -> ClickHouse ingestion daemon.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = commands.add_parser("run", help="run the daemon (what the systemd unit starts)")
    run.add_argument(
        "--config", type=Path, default=DEFAULT_PATH, help=f"config file (default {DEFAULT_PATH})"
    )
    run.add_argument(
        "--log-format", choices=("json", "console"), default="json", help="log line format"
    )
    run.add_argument("--log-level", choices=("debug", "info", "warning", "error"), default="info")
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
    check.add_argument("file", type=Path, nargs="?", default=DEFAULT_PATH)
    check.set_defaults(handler=_config_check)

    init = commands.add_parser(
        "init", help="create the ZooKeeper paths and ClickHouse tables (idempotent)"
    )
    init.add_argument("--config", type=Path, default=DEFAULT_PATH)
    init.set_defaults(handler=_init)

    dev = commands.add_parser(
        "dev", help="the local development stack (ZooKeeper, Kafka, ClickHouse)"
    )
    dev_commands = dev.add_subparsers(dest="dev_command", required=True, metavar="ACTION")
    for name, handler, text in (
        ("up", _dev_up, "start the stack in the background and wait until it is healthy"),
        ("down", _dev_down, "stop every process the last `up` started, by PID"),
        (
            "status",
            _dev_status,
            "show each service, its PID, endpoint and health (exit 1 if unhealthy)",
        ),
    ):
        sub = dev_commands.add_parser(name, help=text, description=text)
        sub.add_argument(
            "--root",
            type=Path,
            default=DEFAULT_DEV_ROOT,
            help="state directory (default: .devstack)",
        )
        sub.set_defaults(handler=handler)
        if name == "up":
            sub.add_argument(
                "--zk-members", type=int, choices=(1, 3), default=1, help="ZooKeeper members"
            )
        if name == "status":
            sub.add_argument("--json", action="store_true", help="print JSON")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one `hakafka` command; return its exit code (0 ok, 1 failure, 2 usage)."""
    from hakafka.daemon import StartupError

    args = build_parser().parse_args(argv)
    try:
        code: int = args.handler(args)
    except (DevstackError, ConfigError, StartupError) as exc:
        print(f"hakafka: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    return code


if __name__ == "__main__":
    sys.exit(main())
