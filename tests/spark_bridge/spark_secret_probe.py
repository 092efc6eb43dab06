"""Helper process for the Spark secrets test: start a SparkRuntime whose `conf` holds a secret
and print (one JSON line) what the rest of the machine can see of it, then stop.

Usage: python spark_secret_probe.py KEY VALUE
Prints {"cmdlines": [argv of every descendant process], "value": KEY's value in the driver
JVM's conf, "private_dirs": hakafka-spark-* directories left in the temp dir}.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

from spark_bridge.runtime import SparkRuntime, SparkSettings


def descendants(root: int) -> list[int]:
    """The PIDs of every live descendant of `root`, read from /proc."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue  # ended meanwhile
        # The command name (2nd field) may hold spaces and parentheses: split after its end.
        parents[int(stat.parent.name)] = int(text[text.rindex(")") + 2 :].split()[1])
    found: list[int] = []
    frontier = [root]
    while frontier:
        pid = frontier.pop()
        children = [child for child, parent in parents.items() if parent == pid]
        found += children
        frontier += children
    return found


def cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]
    except OSError:
        return []


def main() -> None:
    key, value = sys.argv[1], sys.argv[2]
    runtime = SparkRuntime(SparkSettings(driver_memory="600m", conf={key: value}))
    session = runtime.start()
    try:
        report = {
            "cmdlines": [cmdline(pid) for pid in descendants(os.getpid())],
            "value": session.sparkContext.getConf().get(key),
            "private_dirs": [p.name for p in Path(tempfile.gettempdir()).glob("hakafka-spark-*")],
        }
    finally:
        runtime.stop()
    print(json.dumps(report))


if __name__ == "__main__":
    main()
