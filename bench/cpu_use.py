"""Where CPU went over an interval, from /proc: the machine's busy and stolen cores, and per
process (or group of processes below one) its cores split by thread (librdkafka names its
threads `rdk:*`).

A profile without a profiler: it cannot say what a thread waited on, but a thread that never
waits for data yet runs on a core only part of the time is waiting on a lock or on I/O.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

_HZ = os.sysconf("SC_CLK_TCK")


def stat_ticks(stat: str) -> tuple[str, int]:
    """(comm, utime + stime) of one /proc/…/stat line (comm may hold spaces)."""
    comm = stat[stat.index("(") + 1 : stat.rindex(")")]
    fields = stat[stat.rindex(")") + 2 :].split()
    return comm, int(fields[11]) + int(fields[12])


def _machine() -> tuple[int, int, int]:
    """(busy, steal, total) ticks of all CPUs since boot."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    steal = values[7] if len(values) > 7 else 0
    total = sum(values[:8])
    return total - idle - steal, steal, total


def _threads(pid: int) -> dict[int, tuple[str, int]]:
    """Thread id -> (comm, CPU ticks) of every live thread of `pid` ({} once it is gone)."""
    out: dict[int, tuple[str, int]] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return out
    for tid in tids:
        try:
            out[int(tid)] = stat_ticks(Path(f"/proc/{pid}/task/{tid}/stat").read_text())
        except (FileNotFoundError, ProcessLookupError):
            continue  # the thread ended between the listing and the read
    return out


def _parents() -> dict[int, int]:
    """Process id -> parent process id of every live process, from /proc."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except (FileNotFoundError, ProcessLookupError):
            continue
        out[int(entry)] = int(stat[stat.rindex(")") + 2 :].split()[1])
    return out


def children(pid: int) -> list[int]:
    """The live child processes of `pid`, by their parent id in /proc."""
    return [child for child, parent in _parents().items() if parent == pid]


def descendants(pid: int) -> list[int]:
    """The live processes below `pid`: its children, theirs, and so on (not `pid` itself)."""
    parents = _parents()
    found: list[int] = []
    level = [pid]
    while level:
        level = [child for child, parent in parents.items() if parent in level]
        found += level
    return found


@dataclass(frozen=True)
class ProcessCpu:
    """One process over the interval, in cores (CPU seconds per wall second)."""

    cores: float
    rdkafka: float  # threads named rdk:*
    busiest: tuple[float, ...]  # the other threads, busiest first


@dataclass(frozen=True)
class CpuUse:
    """The machine and the watched processes over one interval, in cores."""

    seconds: float
    busy: float
    steal: float
    cores: int
    processes: dict[str, ProcessCpu]  # by the name given to CpuMeter


class CpuMeter:
    """Call `start()` before and `stop()` after the interval; both read /proc and return
    at once, and `stop()` may be called again for a longer interval from the same start.
    `pids` names the processes to watch (several under one name count as one); `below` names
    groups of processes by an ancestor: every process below that pid (not the pid itself), as
    found at the start and at the stop.
    A thread or process that starts inside the interval counts in full; one that ends inside
    it is not counted (its last ticks are gone)."""

    def __init__(
        self, pids: Mapping[str, int | Sequence[int]], below: Mapping[str, int] | None = None
    ) -> None:
        self._members: dict[str, Callable[[], list[int]]] = {
            **{
                name: functools.partial(list, (pid,) if isinstance(pid, int) else pid)
                for name, pid in pids.items()
            },
            **{name: functools.partial(descendants, pid) for name, pid in (below or {}).items()},
        }
        self._began = 0.0
        self._machine = (0, 0, 0)
        self._threads: dict[str, dict[int, tuple[str, int]]] = {}

    def _read(self) -> dict[str, dict[int, tuple[str, int]]]:
        """Every watched group's threads (thread ids are unique across processes)."""
        return {
            name: {tid: t for pid in members() for tid, t in _threads(pid).items()}
            for name, members in self._members.items()
        }

    def start(self) -> None:
        self._began = time.monotonic()
        self._machine = _machine()
        self._threads = self._read()

    def stop(self) -> CpuUse:
        # In the reverse order of `start`, so the threads' interval lies inside the machine's
        # and both inside `seconds`: reading a busy process's threads takes a while, and read
        # last it counted ticks past the machine's (a spinning thread at 1.4 cores against a
        # machine busy 1.15, on a loaded run).
        now = self._read()
        machine = _machine()
        seconds = time.monotonic() - self._began
        busy, steal, total = (
            later - then for later, then in zip(machine, self._machine, strict=True)
        )
        cores = os.cpu_count() or 1
        per_core_tick = total / cores if total else 1
        processes = {}
        for name, before in self._threads.items():
            used: dict[int, tuple[str, int]] = {}
            for tid, (comm, ticks) in now[name].items():
                used[tid] = (comm, ticks - before.get(tid, (comm, 0))[1])
            rdk = sum(t for comm, t in used.values() if comm.startswith("rdk:"))
            others = sorted(
                (t for comm, t in used.values() if not comm.startswith("rdk:")), reverse=True
            )
            scale = _HZ * seconds
            processes[name] = ProcessCpu(
                cores=(rdk + sum(others)) / scale,
                rdkafka=rdk / scale,
                busiest=tuple(t / scale for t in others if t),
            )
        return CpuUse(
            seconds=seconds,
            busy=busy / per_core_tick,
            steal=steal / per_core_tick,
            cores=cores,
            processes=processes,
        )
