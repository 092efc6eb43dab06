"""The `hakafka` and `python -m devstack` commands run as separate processes (their exit
codes are what scripts see), and the edits tests make to the config files of `devstack`
clusters."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from devstack.process import run_hakafka


@dataclass(frozen=True)
class Run:
    code: int
    out: str
    err: str
    raw: bytes  # stdout as written (for --format arrow)


def hakafka(*args: str, timeout: float = 240.0) -> Run:
    """Run `hakafka ARGS...` as a child process; its exit code and output."""
    done = run_hakafka(args, timeout)
    return Run(
        done.returncode,
        done.stdout.decode(errors="replace"),
        done.stderr.decode(errors="replace"),
        done.stdout,
    )


def devstack_cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 90
) -> subprocess.CompletedProcess[str]:
    """Run `python -m devstack ARGS...` as a user runs it (`env`, if given, is its whole
    environment); its exit code and output as text."""
    return subprocess.run(
        [sys.executable, "-m", "devstack", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )


def edit(path: Path, old: str, new: str, count: int = 1) -> None:
    """Replace `old` (a regex, multi-line mode) by `new` in the file at `path`, exactly
    `count` times."""
    text, made = re.subn(old, new, path.read_text(), flags=re.M)
    assert made == count, f"{path.name}: {old!r} matched {made} times, not {count}"
    path.write_text(text)
