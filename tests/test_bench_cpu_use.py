"""bench/cpu_use.py: the /proc readings the e2e bench's CPU rows rest on."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from cpu_use import CpuMeter, children, descendants, stat_ticks


def test_a_stat_line_is_read_past_a_command_name_holding_spaces_and_parentheses() -> None:
    fields = ["S", "1", "1", "1", "0", "-1", "0", "0", "0", "0", "0", "250", "37", "0", "0"]
    comm, ticks = stat_ticks("4242 (rdk:broker (x) 1) " + " ".join(fields))
    assert comm == "rdk:broker (x) 1"
    assert ticks == 287  # utime 250 + stime 37


@pytest.mark.parametrize("thread_name", [None, "rdk:test"])
def test_a_spinning_thread_is_counted_as_a_busiest_thread_or_as_librdkafka(
    thread_name: str | None,
) -> None:
    stop, ready = threading.Event(), threading.Event()

    def spin() -> None:
        if thread_name is not None:  # librdkafka names its threads this way
            Path(f"/proc/self/task/{threading.get_native_id()}/comm").write_text(thread_name)
        ready.set()
        while not stop.is_set():
            pass

    spinner = threading.Thread(target=spin)
    spinner.start()
    try:
        assert ready.wait(5)
        meter = CpuMeter({"self": os.getpid()})
        meter.start()
        time.sleep(1.0)
        use = meter.stop()
    finally:
        stop.set()
        spinner.join(10)
    got = use.processes["self"]
    # Generous bounds: the spinner holds the GIL against nothing but this thread's sleep.
    if thread_name is None:
        assert got.busiest[0] >= 0.3, got
        assert got.rdkafka == 0.0, got
    else:
        assert got.rdkafka >= 0.3, got
    assert got.cores >= 0.3, got
    assert use.busy >= 0.3, use
    assert use.seconds >= 1.0
    assert use.cores == os.cpu_count()


def test_children_lists_a_child_process_until_it_is_gone() -> None:
    child = subprocess.Popen(["sleep", "30"])
    try:
        assert child.pid in children(os.getpid())
    finally:
        child.kill()
        child.wait(10)
    assert child.pid not in children(os.getpid())


def test_a_spinning_grandchild_is_counted_below_its_ancestor_and_nowhere_else() -> None:
    # A child that only waits for its own child, which spins: as Spark's JVM and its workers.
    spin = "import time\nend = time.monotonic() + 30\nwhile time.monotonic() < end: pass"
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import subprocess, sys; subprocess.run([sys.executable, '-c', {spin!r}])",
        ]
    )
    try:
        deadline = time.monotonic() + 10
        while not (below := descendants(parent.pid)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(below) == 1, below
        # This process may have other children (a pytest worker's local stack): only ask
        # that both are below it, the child first.
        mine = descendants(os.getpid())
        assert parent.pid in mine and mine.index(parent.pid) < mine.index(below[0]), mine
        meter = CpuMeter({"parent": parent.pid}, below={"below the parent": parent.pid})
        meter.start()
        time.sleep(1.0)
        use = meter.stop()
    finally:
        parent.kill()
        parent.wait(10)
        for pid in below:
            os.kill(pid, 9)
    assert use.processes["below the parent"].cores >= 0.3, use
    assert use.processes["parent"].cores < 0.1, use


def test_stop_reads_again_from_the_same_start() -> None:
    meter = CpuMeter({"self": os.getpid()})
    meter.start()
    first = meter.stop()
    time.sleep(0.2)
    second = meter.stop()
    assert second.seconds >= first.seconds + 0.2


def test_processes_named_together_count_as_one() -> None:
    spin = "import time\nend = time.monotonic() + 30\nwhile time.monotonic() < end: pass"
    spinners = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(2)]
    try:
        a, b = (p.pid for p in spinners)
        meter = CpuMeter({"a": a, "b": b, "both": [a, b]})
        meter.start()
        time.sleep(1.0)
        use = meter.stop()
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait(10)
    got = use.processes
    assert got["a"].cores >= 0.2 and got["b"].cores >= 0.2, use
    # Read a moment apart from the two alone: a tick (10 ms) or so each may differ.
    assert got["both"].cores == pytest.approx(got["a"].cores + got["b"].cores, abs=0.05), use
