"""Helper process for the process-level coordination tests: one node standing in one shard.

Also home of `CandidateProcess`, which runs this program as a child.

Usage: python coord_candidate.py --hosts H --root R --node N --shard S [--session-timeout T]
Prints one JSON object per line: {"event": "ready"|"became_leader"|"lost"|"suspended"|
"resumed"|"failover_requested"|"commit"|"resigned", "at": unix_time, ...}. Reads commands on
stdin: `commit PIPELINE TOPIC PARTITION OFFSET` (with the fenced state taken when it last
became leader), `resign`, `exit`. On a failover request it resigns at once (no flush here).
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import structlog

from hakafka.coordination import (
    BecameLeader,
    Coordinator,
    FailoverRequested,
    FencedError,
    FencedState,
    LeadershipEvent,
    LostLeadership,
    NodeInfo,
    Resumed,
    Suspended,
    ZkConfig,
    ZooKeeperUnavailableError,
)

UNKNOWN_OUTCOME_RETRIES = 10


class Candidate:
    def __init__(self, args: argparse.Namespace) -> None:
        config = ZkConfig(
            hosts=args.hosts,
            root=args.root,
            session_timeout_s=args.session_timeout,
            request_timeout_s=2.0,
        )
        endpoints = NodeInfo(host="127.0.0.1", http="", flight="", pid=os.getpid(), version="t")
        self.coordinator = Coordinator(config, args.node, endpoints)
        self.shard = args.shard
        self._lock = threading.Lock()
        self.fenced: FencedState | None = None
        self._joined = threading.Event()

    def emit(self, event: str, **fields: Any) -> None:
        fields.setdefault("at", time.time())
        with self._lock:
            sys.stdout.write(json.dumps({"event": event, **fields}) + "\n")
            sys.stdout.flush()

    def on_event(self, event: LeadershipEvent) -> None:
        self._joined.wait(10)  # self.leadership is assigned once join() returns
        if isinstance(event, BecameLeader):
            try:
                self.fenced = self.leadership.fenced()
            except FencedError:
                self.fenced = None  # lost again before this callback ran
            self.emit("became_leader", epoch=event.epoch, token=event.token, at=event.at)
        elif isinstance(event, Resumed):
            self.emit("resumed", epoch=event.epoch, token=event.token, at=event.at)
        elif isinstance(event, LostLeadership):
            self.emit("lost", reason=event.reason, at=event.at)
        elif isinstance(event, Suspended):
            self.emit("suspended", at=event.at)
        elif isinstance(event, FailoverRequested):
            self.emit("failover_requested", to=event.request.to, at=event.at)
            self.leadership.resign("failover requested")
            self.emit("resigned")

    def commit(self, pipeline: str, topic: str, partition: int, offset: int) -> None:
        if self.fenced is None:
            self.emit("commit", error="NeverLed", message="never was leader")
            return
        # Like the daemon: an unknown outcome (connection dropped) is retried; a fenced
        # write is final.
        for _ in range(UNKNOWN_OUTCOME_RETRIES):
            try:
                checkpoint = self.fenced.commit_checkpoint(pipeline, {topic: {partition: offset}})
            except FencedError as exc:
                self.emit("commit", error="FencedError", message=str(exc))
                return
            except ZooKeeperUnavailableError as exc:
                self.emit("commit_unknown", message=str(exc))
                time.sleep(0.5)
                continue
            self.emit("commit", ok=True, checkpoint={t: dict(p) for t, p in checkpoint.items()})
            return
        self.emit("commit", error="Unavailable", message="gave up")

    def run(self) -> None:
        self.coordinator.start()
        self.coordinator.register()
        self.leadership = self.coordinator.join(self.shard, on_change=self.on_event)
        self._joined.set()
        self.emit("ready", pid=os.getpid())
        for line in sys.stdin:
            words = line.split()
            if not words:
                continue
            if words[0] == "commit":
                self.commit(words[1], words[2], int(words[3]), int(words[4]))
            elif words[0] == "resign":
                self.leadership.resign("asked on stdin")
                self.emit("resigned")
            elif words[0] == "exit":
                break
        self.coordinator.close()
        self.emit("closed")


class CandidateProcess:
    """This program as a child process (for tests and the bench): its JSON events, commands
    and signals. Stopped by its PID only."""

    def __init__(
        self, hosts: str, root: str, node: str, shard: int = 0, session_timeout: float = 2.0
    ) -> None:
        self.node = node
        self.shard = shard
        argv = [sys.executable, __file__, "--hosts", hosts, "--root", root, "--node", node]
        argv += ["--shard", str(shard), "--session-timeout", str(session_timeout)]
        self.popen = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            bufsize=1,
        )
        self.events: list[dict[str, Any]] = []
        self._new: queue.SimpleQueue[dict[str, Any]] = queue.SimpleQueue()
        threading.Thread(target=self._read, daemon=True).start()

    @property
    def pid(self) -> int:
        return self.popen.pid

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            if line.startswith("{"):  # anything else is stray output, not an event
                event = json.loads(line)
                self.events.append(event)
                self._new.put(event)

    def wait_event(self, kind: str, timeout: float) -> dict[str, Any]:
        """The next event of `kind` not yet waited for (earlier ones are skipped);
        TimeoutError listing every event after `timeout` s."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{self.node}: no {kind!r} event in {timeout} s: {self.events}")
            try:
                event = self._new.get(timeout=left)
            except queue.Empty:
                continue
            if event["event"] == kind:
                return event

    def became_after(self, since: float) -> float | None:
        """When it first became leader after `since` (Unix time), or None."""
        times = [e["at"] for e in self.events if e["event"] == "became_leader" and e["at"] > since]
        return min(times) if times else None

    def send(self, command: str) -> None:
        assert self.popen.stdin is not None
        self.popen.stdin.write(command + "\n")
        self.popen.stdin.flush()

    def alive(self) -> bool:
        """True until the process has exited."""
        return self.popen.poll() is None

    def signal(self, sig: signal.Signals) -> None:
        if self.popen.poll() is None:
            os.kill(self.pid, sig)

    def stop(self) -> None:
        """SIGCONT (in case it is frozen), then SIGKILL, by PID; reap it."""
        if self.popen.poll() is None:
            os.kill(self.pid, signal.SIGCONT)
            os.kill(self.pid, signal.SIGKILL)
        self.popen.wait(timeout=10)


def main() -> None:
    # stdout carries the JSON events; logs go to stderr.
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(file=sys.stderr))
    parser = argparse.ArgumentParser()
    parser.add_argument("--hosts", required=True)
    parser.add_argument("--root", required=True)
    parser.add_argument("--node", required=True)
    parser.add_argument("--shard", type=int, default=0)
    parser.add_argument("--session-timeout", type=float, default=2.0)
    Candidate(parser.parse_args()).run()


if __name__ == "__main__":
    main()
