"""`python -m devstack up|status|down`: the local stack for development and tests.

Not part of the shipped daemon: a production host has no `dev` command. Every server binds
to 127.0.0.1; `down` stops exactly the PIDs the last `up` started.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from devstack.process import DevstackError
from devstack.spark_cluster import SPARK_SERVICE
from devstack.stack import DevStack

EXIT_OK = 0
EXIT_FAILURE = 1

DEFAULT_ROOT = Path(".devstack")


def _up(args: argparse.Namespace) -> int:
    stack = DevStack(args.root)
    began = time.monotonic()
    records = stack.up(zk_members=args.zk_members, clickhouse_servers=args.clickhouse_servers)
    if args.spark:
        stack.start_spark(args.spark)
        records = stack.records()
    for r in records:
        print(f"{r.name:<11} pid {r.pid:<8} {r.endpoint}")
    print(f"stack up in {time.monotonic() - began:.1f} s; endpoints in {stack.env_path}")
    return EXIT_OK


def _down(args: argparse.Namespace) -> int:
    stopped = DevStack(args.root).down()
    for r in stopped:
        print(f"stopped {r.name} (pid {r.pid})")
    if not stopped:
        print("nothing was running")
    return EXIT_OK


def _status(args: argparse.Namespace) -> int:
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m devstack",
        description="The local development stack (ZooKeeper, Kafka, ClickHouse) on 127.0.0.1.",
    )
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    for name, handler, text in (
        ("up", _up, "start the stack in the background and wait until it is healthy"),
        ("down", _down, "stop every process the last `up` started, by PID"),
        ("status", _status, "show each service, its PID, endpoint and health (exit 1 if not)"),
    ):
        sub = actions.add_parser(name, help=text, description=text)
        sub.add_argument(
            "--root", type=Path, default=DEFAULT_ROOT, help="state directory (default: .devstack)"
        )
        sub.set_defaults(handler=handler)
        if name == "up":
            sub.add_argument(
                "--zk-members", type=int, choices=(1, 3), default=1, help="ZooKeeper members"
            )
            sub.add_argument(
                "--spark",
                action="append",
                choices=tuple(SPARK_SERVICE),
                default=[],
                help="also start Spark (repeatable): a standalone master and worker, or a "
                "Spark Connect server",
            )
            sub.add_argument(
                "--clickhouse-servers",
                type=int,
                choices=(1, 2),
                default=1,
                help="ClickHouse servers, one per shard (default 1)",
            )
        if name == "status":
            sub.add_argument("--json", action="store_true", help="print JSON")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one action; 0 ok, 1 failed (one line on stderr), 2 usage."""
    args = build_parser().parse_args(argv)
    try:
        code: int = args.handler(args)
    except DevstackError as exc:
        print(f"devstack: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    return code


if __name__ == "__main__":
    sys.exit(main())
