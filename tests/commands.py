"""The `hakafka` command run as a separate process (its exit code is what scripts see), and
the edits tests make to the config files of `devstack` clusters."""

from __future__ import annotations

import re
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


def edit(path: Path, old: str, new: str, count: int = 1) -> None:
    """Replace `old` (a regex, multi-line mode) by `new` in the file at `path`, exactly
    `count` times."""
    text, made = re.subn(old, new, path.read_text(), flags=re.M)
    assert made == count, f"{path.name}: {old!r} matched {made} times, not {count}"
    path.write_text(text)
