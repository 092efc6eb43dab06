"""Run every benchmark under bench/ one after another and record their output.

Usage: python bench/run_all.py [NAME ...]   (names like `wal`, `takeover`; default: all)

Every `bench/NAME_bench.py` is a benchmark (so `takeover_bench.py` is `takeover`); they run one
at a time, in name order, never overlapping: `e2e`, `exactly_once`, `ops` and `takeover` start
real daemons on the local stack and need the machine to themselves.

Each benchmark prints its own figures next to a raw baseline measured in the same run.
This script writes them, with the command that produced them, to bench/RESULTS.md,
replacing the section of each benchmark it ran and keeping the others.
"""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
RESULTS = BENCH_DIR / "RESULTS.md"
TIMEOUT_S = 2400  # per benchmark: e2e and takeover take about 10 minutes each, scale 25
# The heading of a section, after its name, when the name alone does not say what it measures.
TITLES = {
    "lanes": "Several consume lanes per shard (#32)",
    "push": "The buffer as a write cache: pushed batches (#33)",
    "exactly_once": "Exactly-once under drift and resharding (#21)",
    "flush_modes": "Flush through Spark standalone and Spark Connect next to local mode (#24)",
    "handoff_tls": "Handoff over TLS (#34)",
    "zookeeper_tls": "ZooKeeper over TLS (#34)",
    "ops": "What the operator's tools cost a running cluster (#25)",
    "security": "What failing closed costs (#22)",
    "read": "read_table over two shards next to one direct query per shard (#24)",
    "liveness": "Unknown ZooKeeper outcomes resolved, probes under a flood (#38)",
    "scale": "30 daemons and 100 shards on one ZooKeeper ensemble (#35)",
}
HEADER = """# Benchmark results

Every figure is printed next to a raw baseline measured in the same run on the same machine,
so the ratio is what carries over between machines. Regenerate with `make bench` (all) or
`.venv/bin/python bench/run_all.py NAME` (one); each section says the exact command.
"""


def sections(text: str) -> dict[str, str]:
    """The `## name` sections of RESULTS.md by name (a title may follow the name)."""
    found: dict[str, str] = {}
    for match in re.finditer(r"^## (\S+)[^\n]*\n(.*?)(?=^## |\Z)", text, flags=re.M | re.S):
        found[match.group(1)] = match.group(0).rstrip() + "\n"
    return found


def run(name: str) -> str:
    script = BENCH_DIR / f"{name}_bench.py"
    command = f"PYTHONPATH=. .venv/bin/python bench/{script.name}"
    began = time.monotonic()
    # devstack (the local stack the benches start) runs from the checkout, never installed.
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    result = subprocess.run(
        [sys.executable, str(script)],
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    took = time.monotonic() - began
    print(result.stdout, end="")
    if result.returncode != 0:
        print(result.stderr, file=sys.stderr)
    status = "" if result.returncode == 0 else f"\n**exit code {result.returncode}**\n"
    load = os.getloadavg()[0]
    title = f" — {TITLES[name]}" if name in TITLES else ""
    return (
        f"## {name}{title}\n\n"
        f"Command: `{command}` — {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
        f"{os.cpu_count()} cores, {platform.python_implementation()} {platform.python_version()}, "
        f"load average {load:.1f} at the end, {took:.0f} s.\n{status}\n"
        f"```\n{result.stdout.rstrip()}\n```\n"
    )


def main(argv: list[str]) -> int:
    available = sorted(p.name.removesuffix("_bench.py") for p in BENCH_DIR.glob("*_bench.py"))
    wanted = argv or available
    unknown = [n for n in wanted if n not in available]
    if unknown:
        print(f"unknown benchmark(s): {', '.join(unknown)}; available: {', '.join(available)}")
        return 2
    existing = sections(RESULTS.read_text()) if RESULTS.exists() else {}
    for name in wanted:
        print(f"== {name} ==", flush=True)
        existing[name] = run(name)
    body = "\n".join(existing[n] for n in sorted(existing))
    RESULTS.write_text(HEADER + "\n" + body)
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
