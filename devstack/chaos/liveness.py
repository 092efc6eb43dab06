"""Health is data moving: `LivenessMonitor` samples every shard's progress and its nodes'
`/ready` about once a second during a chaos run, so the run can fail on a shard that stood
still while its nodes said they were ready; `liveness_summary` is what it prints."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from devstack.chaos.driver import Fault

from devstack.cluster import LocalCluster


@dataclass(frozen=True)
class LivenessSample:
    """One look at one shard: seconds since it last made progress (its leader's checkpoint
    advanced, or it had nothing to do: lag 0 and an empty buffer), and whether every live
    node serving it answered `/ready` 200."""

    at: float  # time.monotonic()
    shard: int
    stalled: float
    ready: bool


class LivenessMonitor:
    """Samples every shard about once a second from the nodes' `/status` and `/ready`
    (thread `chaos-liveness`), so that the run can check that no shard is stuck while its
    nodes say they are ready, and how long each kind of fault kept the shards still."""

    def __init__(
        self, cluster: LocalCluster, shards: Callable[[], Sequence[int]], interval: float = 1.0
    ) -> None:
        self._cluster, self._shards, self._interval = cluster, shards, interval
        self.samples: list[LivenessSample] = []
        # shard -> (pipeline, partition) -> the highest checkpoint seen there
        self._checkpoints: dict[int, dict[tuple[str, str], int]] = {}
        self._progress: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-liveness", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self._sample(time.monotonic())
            except Exception as exc:  # a sample is best effort; the run goes on
                print(f"chaos: liveness sample failed: {exc!r}", flush=True)

    def _sample(self, now: float) -> None:
        views: dict[str, dict[str, Any]] = {}
        ready: dict[str, bool] = {}
        for name, node in self._cluster.nodes.items():
            if node.process is None or not node.alive():
                continue
            try:
                views[name] = node.status()
                ready[name] = node.get("/ready", timeout=3.0)[0] == 200
            except Exception:
                ready[name] = False  # frozen or not answering: not ready
        serving = {n: node.configured_shards() for n, node in self._cluster.nodes.items()}
        self.observe(now, views, ready, serving)

    def observe(
        self,
        now: float,
        views: dict[str, dict[str, Any]],
        ready: dict[str, bool],
        serving: dict[str, list[int]],
    ) -> None:
        """Record one sample per shard from the live nodes' `/status` (`views`), their
        `/ready` (`ready`) and the shards each node is configured for (`serving`). A shard
        progresses when its leader's checkpoint of some partition it consumed before advanced,
        or when it has nothing to do (lag 0, empty buffer). Offsets are compared per partition:
        a reshard moves partitions between shards, and a sum over a shard's partitions drops
        with a partition that leaves it."""
        for shard in self._shards():
            seen = self._checkpoints.setdefault(shard, {})
            advanced, idle = False, False
            for view in views.values():
                for entry in view.get("shards", []):
                    if entry.get("shard") != shard or entry.get("role") != "leader":
                        continue
                    pipelines = entry.get("pipelines", [])
                    for p in pipelines:
                        for partition, offset in p["checkpoint"].items():
                            key = (str(p.get("name")), str(partition))
                            advanced |= key in seen and offset > seen[key]
                            seen[key] = max(offset, seen.get(key, offset))
                    idle = bool(pipelines) and all(
                        not any(p["lag"].values()) and not p["buffer_rows"] for p in pipelines
                    )
            self._progress.setdefault(shard, now)
            if idle or advanced:
                self._progress[shard] = now
            nodes = [n for n in ready if shard in serving.get(n, [])]
            self.samples.append(
                LivenessSample(
                    now,
                    shard,
                    now - self._progress[shard],
                    bool(nodes) and all(ready[n] for n in nodes),
                )
            )

    def ready_while_stuck(
        self, bound: float, persist: int = 1, resets: Sequence[float] = ()
    ) -> list[LivenessSample]:
        """Samples of a shard without progress for longer than `bound` while every node
        serving it said it was ready: the lie this run must never see. With `persist`, only
        runs of at least that many such samples in a row for one shard (about a second
        apart): at a leadership change the stuck leader is a follower, ready, a moment before
        its successor's new term carries the shard's stall, and two probes a second apart
        can both fall in that moment. `resets` (monotonic times) are where the daemons'
        measure starts again by design: a reshard rewrites every checkpoint, and a new term
        counts its stall from its shard's last checkpoint write."""
        found: list[LivenessSample] = []
        for shard in sorted({s.shard for s in self.samples}):
            run: list[LivenessSample] = []
            for sample in sorted((s for s in self.samples if s.shard == shard), key=lambda s: s.at):
                since_reset = [sample.at - r for r in resets if r <= sample.at]
                stalled = min([sample.stalled, *since_reset])
                if stalled > bound and sample.ready:
                    run.append(sample)
                    continue
                found += run if len(run) >= persist else []
                run = []
            found += run if len(run) >= persist else []
        return found

    def progress_after(self, at: float) -> float | None:
        """Seconds from `at` until every shard that existed then had made progress again
        (None: not seen)."""
        waits = []
        for shard in {s.shard for s in self.samples if s.at <= at}:
            later = [s for s in self.samples if s.shard == shard and s.at >= at]
            first = next((s for s in later if s.stalled <= s.at - at), None)
            if first is None:
                return None
            waits.append(max(0.0, first.at - first.stalled - at))
        return max(waits, default=None)


@dataclass(frozen=True)
class Recovery:
    """One applied fault: seconds from its end until every shard progressed again (None:
    not seen), and how long the run left it alone (until the next fault or reshard began;
    None: nothing came after it)."""

    kind: str
    ended: float  # seconds into the run
    took: float | None
    alone: float | None

    def slow(self, bound: float) -> bool:
        """True if the shards had `bound` seconds to themselves after this fault and did not
        all progress within them; a fault the next one followed sooner proves nothing."""
        if self.took is not None and self.took <= bound:
            return False
        return self.alone is None or self.alone >= bound


def recoveries(
    faults: Sequence[Fault],
    began: float,
    monitor: LivenessMonitor,
    disturbances: Sequence[float] = (),
) -> list[Recovery]:
    """A `Recovery` for each applied fault; `disturbances` are other moments (seconds into
    the run) that stop the shards as a fault does, e.g. a reshard's request."""
    applied = [f for f in faults if f.outcome.startswith("applied")]
    starts = sorted([f.at for f in applied] + list(disturbances))
    found = []
    for fault in applied:
        ended = fault.at + fault.seconds
        after = [t for t in starts if t > fault.at]
        found.append(
            Recovery(
                fault.kind,
                ended,
                monitor.progress_after(began + ended),
                max(0.0, after[0] - ended) if after else None,
            )
        )
    return found


def liveness_summary(
    found: Sequence[Recovery], monitor: LivenessMonitor, bounds: Sequence[float]
) -> str:
    """Per fault kind, the longest time from a fault's end until every shard progressed
    again, and for each of `bounds` the samples of a shard stuck past it while its nodes
    said ready."""
    longest: dict[str, float | None] = {}
    for recovery in found:
        before = longest.get(recovery.kind, 0.0)
        took = recovery.took
        longest[recovery.kind] = None if took is None or before is None else max(before, took)
    kinds = ", ".join(
        f"{kind} {'never' if s is None else f'{s:.1f}s'}" for kind, s in sorted(longest.items())
    )
    counts = []
    for bound in bounds:
        lies = monitor.ready_while_stuck(bound)
        worst = max((s.stalled for s in lies), default=None)
        counts.append(
            f"{len(lies)} with a shard stuck > {bound:g} s while its nodes said ready"
            + ("" if worst is None else f" (longest {worst:.1f} s)")
        )
    return (
        f"liveness: longest fault end -> every shard progressing: {kinds or 'no faults'}; "
        f"{len(monitor.samples)} samples, " + ", ".join(counts)
    )
