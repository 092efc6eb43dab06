"""Run Python code in a fresh interpreter: what a module import or a command loads can only be
seen there (the test process has everything loaded already)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def fresh_run(
    code: str, timeout: float = 120.0, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`python -c code` run from the repository root (with `env` added to the environment):
    its exit code, standard output and standard error."""
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def fresh_python(code: str, timeout: float = 120.0, env: Mapping[str, str] | None = None) -> str:
    """The standard output of `fresh_run(code)`; AssertionError with its standard error if
    it fails."""
    done = fresh_run(code, timeout, env)
    assert done.returncode == 0, done.stderr
    return done.stdout


def loaded(prefixes: list[str], modules: list[str]) -> list[str]:
    """The modules of `modules` that are one of `prefixes` or inside one of them."""
    return [m for m in modules if any(m == p or m.startswith(p + ".") for p in prefixes)]
