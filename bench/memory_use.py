"""What a process and everything below it hold in memory now, from /proc: the sum of their
resident sets (RSS: pages shared between a forked Python worker and its parent count in
both) and of their proportional sets (PSS: a shared page split among its users, so the sum
is what the group costs the host, close to what a cgroup's `MemoryMax` charges)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cpu_use import descendants

MIB = 1024 * 1024


@dataclass(frozen=True)
class TreeMemory:
    rss: int  # bytes
    pss: int  # bytes
    processes: int

    def text(self) -> str:
        return f"RSS {self.rss / MIB:,.0f} MiB, PSS {self.pss / MIB:,.0f} MiB"


def _kib(path: Path, key: str) -> int:
    """The `key:` line of a /proc file in bytes (0 once the process is gone)."""
    try:
        for line in path.read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0


def tree_memory(pid: int) -> TreeMemory:
    """RSS and PSS summed over `pid` and its descendants (a JVM, its Python workers)."""
    pids = [pid, *descendants(pid)]
    proc = Path("/proc")
    return TreeMemory(
        rss=sum(_kib(proc / str(p) / "status", "VmRSS") for p in pids),
        pss=sum(_kib(proc / str(p) / "smaps_rollup", "Pss") for p in pids),
        processes=len(pids),
    )
