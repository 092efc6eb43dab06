"""`make demo` as a user runs it: exit 0, an exactly-once tally, nothing left running."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from devstack.process import pid_alive, pid_cmdline, processes_under, stop_pid

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.slow(seconds=110)]

REPO = Path(__file__).resolve().parents[2]
DEMO_TIMEOUT_S = 300.0  # it takes about a minute here; the README promises about two
TAG_VAR = "HAKAFKA_DEMO_TEST_TAG"
# What the demo promises in the README: 200,000 events, 200 of them malformed.
PRODUCED = 200_000
MALFORMED = 200
TALLY = re.compile(
    r"ClickHouse (?P<table>events|events_dead_letter): (?P<rows>[\d,]+) rows for "
    r"(?P<expected>[\d,]+) (?:good|malformed) records; "
    r"duplicates (?P<duplicates>\d+), missing (?P<missing>\d+)"
)


def processes_tagged(tag: str) -> dict[int, str]:
    """PID -> command line of every live process whose environment holds `tag`: the demo's
    children inherit its environment, also those it started in their own sessions."""
    found = {}
    needle = tag.encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read().split(b"\0")
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if needle in environ and pid_alive(int(entry)):
            found[int(entry)] = " ".join(pid_cmdline(int(entry)))
    return found


@pytest.mark.timeout(DEMO_TIMEOUT_S + 60)
def test_demo_runs_end_to_end_exactly_once(tmp_path: Path) -> None:
    tag_value = uuid.uuid4().hex
    tag = f"{TAG_VAR}={tag_value}"
    # The demo keeps its stack under tempfile.mkdtemp(): TMPDIR puts it in tmp_path.
    env = dict(os.environ, TMPDIR=str(tmp_path), **{TAG_VAR: tag_value})
    began = time.monotonic()
    try:
        demo = subprocess.run(
            [sys.executable, "-m", "devstack.demo"],
            capture_output=True,
            text=True,
            timeout=DEMO_TIMEOUT_S,
            env=env,
            cwd=REPO,
            check=False,
        )
    finally:
        took = time.monotonic() - began
        # Whatever the demo left behind (also after a timeout), then stopped by PID.
        leftovers = {**processes_tagged(tag), **processes_under(tmp_path)}
        for pid, cmdline in leftovers.items():
            stop_pid(pid, marker=cmdline)
    output = demo.stdout + demo.stderr
    print(f"demo took {took:.0f} s:\n{demo.stdout}")
    assert demo.returncode == 0, output[-4000:]
    assert not leftovers, f"the demo left processes running: {leftovers}"
    assert [p for p in tmp_path.iterdir() if p.name.startswith("hakafka-demo-")], "no demo root"

    tallies = {m["table"]: m for m in TALLY.finditer(demo.stdout)}
    assert set(tallies) == {"events", "events_dead_letter"}, demo.stdout
    events, dead = tallies["events"], tallies["events_dead_letter"]
    good = int(events["expected"].replace(",", ""))
    malformed = int(dead["expected"].replace(",", ""))
    assert (good, malformed) == (PRODUCED - MALFORMED, MALFORMED), demo.stdout
    for tally, expected in ((events, good), (dead, malformed)):
        # Every record exactly once: as many rows as records, none twice, none missing.
        assert int(tally["rows"].replace(",", "")) == expected, tally[0]
        assert (tally["duplicates"], tally["missing"]) == ("0", "0"), tally[0]
    assert "exactly once: YES" in demo.stdout
    assert "stopped every process it started" in demo.stdout
