"""A server in a child process of its own (so its memory and CPU time are its own): it prints
one JSON line once it serves and stops when its stdin closes. The query bounds tests and the
security bench run theirs so."""

from __future__ import annotations

import json
import select
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self


class ChildServer:
    """The child process `argv` (with `env`, in `cwd`), started and read until it announces
    what it serves (`announced`, its JSON line); `TimeoutError`, the child closed, when it has
    not within `start_s` seconds. Leaving the `with` block closes it."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        start_s: float,
        cwd: Path | None = None,
    ) -> None:
        self.proc = subprocess.Popen(
            list(argv),
            cwd=cwd,
            env=dict(env),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], start_s)
        if not ready:
            self.close()
            raise TimeoutError(f"the server process did not start within {start_s} s")
        self.announced: Any = json.loads(self.proc.stdout.readline())

    def close(self) -> None:
        """Close its stdin, so it stops; killed (by PID) if it has not within 10 s."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
