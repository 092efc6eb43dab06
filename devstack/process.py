"""Child processes of the local stack: start, wait for health, stop by PID.

Every service of the devstack is one OS process that this module starts with its own log
file. Processes are only ever stopped through the PID we recorded when starting them (and
only if that PID still runs the command we started), never by name.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, TypeVar

LOOPBACK = "127.0.0.1"
# The checkout that holds this package (devstack runs from a checkout, never installed).
CHECKOUT = Path(__file__).resolve().parents[1]


class Service(Protocol):
    """A local-stack service: `start` waits until it is healthy, `stop` stops it by PID."""

    def start(self) -> None: ...

    def stop(self) -> None: ...


S = TypeVar("S", bound=Service)


@contextlib.contextmanager
def running(service: S) -> Iterator[S]:
    """`service` started for the duration of the block and stopped afterwards, also when
    `start` itself fails half way (e.g. one ZooKeeper member up, another not)."""
    try:
        service.start()
        yield service
    finally:
        service.stop()


class DevstackError(RuntimeError):
    """A local-stack service could not be started, checked or stopped; the text says what to do."""


# Listening ports come from below the kernel's ephemeral range (32768-60999 by default): a
# port the OS hands out for `bind(0)` is also what outgoing connections take, and with 30
# daemons connecting while the others start, one took a daemon's port before it listened.
PORTS = range(20_000, 32_768)


def free_port(host: str = LOOPBACK) -> int:
    """Return a TCP port on `host` that was free a moment ago, outside the ephemeral range
    (`PORTS`, tried at random; the OS picks one if 200 tries find none)."""
    for port in random.sample(PORTS, 200):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def ensure_port_free(port: int, host: str = LOOPBACK, *, what: str) -> None:
    """Raise `DevstackError` naming `what` if `host:port` cannot be bound right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # Servers bind with SO_REUSEADDR: old connections in TIME_WAIT do not block them.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise DevstackError(
                f"{what}: port {port} on {host} is in use ({exc.strerror}); "
                "stop whatever listens there or choose another port"
            ) from None


def port_open(port: int, host: str = LOOPBACK, timeout: float = 0.5) -> bool:
    """True if something accepts TCP connections on `host:port`."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def wait_until(
    check: Callable[[], bool], *, timeout: float, what: str, interval: float = 0.1
) -> None:
    """Return once `check()` is true; raise `DevstackError` naming `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if check():
                return
        except DevstackError:
            raise
        except Exception:  # not ready yet: checks raise while a service boots
            pass
        if time.monotonic() >= deadline:
            raise DevstackError(f"{what} did not become ready within {timeout:.0f} s")
        time.sleep(interval)


def pid_alive(pid: int) -> bool:
    """True if `pid` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            state = stat.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state != "Z"


def freeze(pid: int, timeout: float = 10.0) -> None:
    """SIGSTOP `pid` and return once every thread of it is stopped: on a loaded machine a
    thread running at the signal may still answer a request first."""
    os.kill(pid, signal.SIGSTOP)

    def stopped() -> bool:
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                state = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except (FileNotFoundError, IndexError):
                continue  # a thread that ended meanwhile
            if state not in ("T", "t"):
                return False
        return True

    wait_until(stopped, timeout=timeout, what=f"pid {pid} stopped", interval=0.01)


def pid_cmdline(pid: int) -> list[str]:
    """The argv of `pid`, or an empty list if it is gone."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def processes_under(root: Path) -> dict[int, str]:
    """PID -> command line (arguments joined by spaces) of every live process whose command
    line mentions `root`: what a stack or a test under `root` started and left running."""
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and pid_alive(int(entry)):
            cmdline = " ".join(pid_cmdline(int(entry)))
            if str(root) in cmdline:
                found[int(entry)] = cmdline
    return found


def stop_pid(pid: int, *, marker: str, timeout: float = 10.0) -> bool:
    """Stop `pid` (SIGTERM, then SIGKILL after `timeout` s) if its command line contains `marker`.

    The command line is matched as its arguments joined by single spaces.

    Returns True if the process was ours and is gone now, False if it was already gone or the
    PID now belongs to another program (then it is left alone).
    """
    if not pid_alive(pid) or marker not in " ".join(pid_cmdline(pid)):
        return False
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if pid_alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        kill_deadline = time.monotonic() + 5.0
        while pid_alive(pid) and time.monotonic() < kill_deadline:
            time.sleep(0.05)
    return not pid_alive(pid)


@dataclass
class ManagedProcess:
    """One child process with a log file; `marker` identifies it in /proc/<pid>/cmdline."""

    name: str
    argv: Sequence[str]
    log_path: Path
    marker: str
    env: Mapping[str, str] | None = None
    cwd: Path | None = None
    popen: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen is not None else None

    def start(self) -> int:
        """Start the process detached from our terminal; return its PID."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        if self.env:
            env.update(self.env)
        # devstack is not installed (it is not in the wheel): its own modules started as
        # processes (`-m devstack.…`) find it through the checkout it runs from.
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(CHECKOUT), env.get("PYTHONPATH", "")) if p
        )
        with open(self.log_path, "ab") as log:
            self.popen = subprocess.Popen(
                list(self.argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self.cwd,
                start_new_session=True,
            )
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def exited_with(self) -> int | None:
        """The exit code if the process has ended, else None."""
        return None if self.popen is None else self.popen.poll()

    def log_tail(self, lines: int = 20) -> str:
        """The last `lines` lines of the process log, for error messages."""
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def wait_ready(self, check: Callable[[], bool], *, timeout: float) -> None:
        """Wait until `check()` passes; fail early with the log tail if the process exits.

        A process that does not become ready (timeout, exit, interrupt) is stopped by PID
        before the error propagates: a failed start leaves nothing running.
        """
        try:
            self._wait_ready(check, timeout)
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, check: Callable[[], bool], timeout: float) -> None:
        def ready() -> bool:
            code = self.exited_with()
            if code is not None:
                raise DevstackError(
                    f"{self.name} exited with code {code} while starting; "
                    f"log {self.log_path}:\n{self.log_tail()}"
                )
            return check()

        try:
            wait_until(ready, timeout=timeout, what=self.name)
        except DevstackError as exc:
            if "did not become ready" not in str(exc):
                raise
            raise DevstackError(
                f"{self.name} did not become healthy within {timeout:.0f} s; "
                f"log {self.log_path}:\n{self.log_tail()}"
            ) from None

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the process by its PID and reap it."""
        if self.popen is None:
            return
        if self.popen.poll() is None:
            stop_pid(self.popen.pid, marker=self.marker, timeout=timeout)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=5.0)

    def kill(self, sig: signal.Signals = signal.SIGKILL) -> None:
        """Send `sig` to the process (for fault injection); does not wait."""
        if self.popen is not None and self.popen.poll() is None:
            os.kill(self.popen.pid, sig)


class ManagedService:
    """A devstack service run as one `ManagedProcess`: `process` (None until `start`), its
    PID while it runs, started healthy or not at all, stopped by PID."""

    def __init__(self) -> None:
        self.process: ManagedProcess | None = None

    @property
    def pid(self) -> int | None:
        """The PID of the service's process while it runs, else None."""
        return self.process.pid if self.process is not None and self.process.alive() else None

    def _refuse_busy(self, port: int, host: str, *, what: str) -> None:
        """Raise `DevstackError` naming `what` if this service already runs or something
        listens on `host:port`; sockets only in TIME_WAIT do not count."""
        if self.process is not None and self.process.alive():
            raise DevstackError(f"{what} on port {port} is already running")
        try:
            ensure_port_free(port, host, what=what)
        except DevstackError:
            if port_open(port, host):
                raise

    def _launch(self, process: ManagedProcess, ready: Callable[[], bool], timeout: float) -> None:
        """Start `process` as this service's and return once `ready()` is true; one that is
        not ready within `timeout` s is stopped by PID (`ManagedProcess.wait_ready`)."""
        process.start()
        self.process = process
        process.wait_ready(ready, timeout=timeout)

    def stop(self) -> None:
        """Stop the service's process by its PID (no-op if it is not running)."""
        if self.process is not None:
            self.process.stop()


def run_hakafka(args: Sequence[str], timeout: float) -> subprocess.CompletedProcess[bytes]:
    """`hakafka ARGS` as an operator runs it: a child process of this Python, its output
    captured, waited for at most `timeout` s (`subprocess.TimeoutExpired` after)."""
    return subprocess.run(
        [sys.executable, "-m", "hakafka.cli", *args],
        capture_output=True,
        timeout=timeout,
        check=False,
    )
