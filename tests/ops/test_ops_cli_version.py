"""`hakafka --version` prints the installed version (it exited 2, a usage error)."""

from __future__ import annotations

from importlib.metadata import version

from tests.commands import hakafka


def test_version_prints_the_installed_version() -> None:
    done = hakafka("--version", timeout=60)
    assert (done.code, done.out, done.err) == (0, f"hakafka {version('hakafka')}\n", "")
