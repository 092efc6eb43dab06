"""A daemon's JSON log events, read from its output file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from devstack.cluster import DaemonNode


def log_events(path: Path, offset: int = 0) -> list[dict[str, Any]]:
    """The JSON events of a daemon's output file from byte `offset` on, in order; lines that
    are not JSON objects are skipped."""
    with path.open("rb") as f:
        f.seek(offset)
        lines = f.read().decode(errors="replace").splitlines()
    found = []
    for line in lines:
        if line.startswith("{"):
            try:
                found.append(json.loads(line))
            except ValueError:
                continue  # a line another writer (the JVM) interleaved with ours
    return found


def events(node: DaemonNode, name: str) -> list[dict[str, Any]]:
    """The events called `name` that `node` has logged so far."""
    return [e for e in log_events(node.log_path) if e.get("event") == name]
