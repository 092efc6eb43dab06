"""TCP forwarders as processes of their own: a network namespace's way out, and a node's own
endpoint in front of a shared server (a fault kills it: the node's replica is gone).

Run as ``python -m devstack.tcp_forward LHOST:LPORT=THOST:TPORT ...``: each listener accepts
connections and pumps bytes both ways to its target until the process is killed. It prints
``FORWARDING`` once every listener is bound. `TcpForwarder` starts one such process, stops it
by PID and starts it again on the same ports. For tests, the chaos run and `make demo`;
shipped code never imports it.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from devstack.process import ManagedProcess

FORWARDING = "forwarding:"
CONNECT_TIMEOUT_S = 5.0


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)


def _serve(listener: socket.socket, target: tuple[str, int]) -> None:
    while True:
        client, _ = listener.accept()
        try:
            upstream = socket.create_connection(target, timeout=CONNECT_TIMEOUT_S)
        except OSError:
            client.close()
            continue
        upstream.settimeout(None)
        for a, b in ((client, upstream), (upstream, client)):
            threading.Thread(target=_pump, args=(a, b), daemon=True).start()


def _address(text: str) -> tuple[str, int]:
    host, port = text.rsplit(":", 1)
    return host, int(port)


def forward_main(specs: Sequence[str]) -> None:
    """Forward TCP for each `listen_host:port=target_host:port` until killed."""
    threads = []
    for spec in specs:
        listen, target = spec.split("=", 1)
        listener = socket.create_server(_address(listen), reuse_port=False)
        threads.append(
            threading.Thread(target=_serve, args=(listener, _address(target)), daemon=True)
        )
    for thread in threads:
        thread.start()
    print(f"{FORWARDING} {' '.join(specs)}", flush=True)
    while True:
        time.sleep(3600)


class TcpForwarder:
    """One forwarder process for `specs` (``listen=target`` pairs), its argv prefixed by
    `prefix` (e.g. ``ip netns exec NAME``); `start` waits until it listens, `kill` ends it
    at once (SIGKILL: every connection through it is reset, new ones are refused)."""

    def __init__(
        self, name: str, specs: Sequence[str], log_path: Path, prefix: Sequence[str] = ()
    ) -> None:
        self.name = name
        self.specs = list(specs)
        self._argv = [*prefix, sys.executable, "-m", "devstack.tcp_forward", *self.specs]
        self._log_path = log_path
        self.process: ManagedProcess | None = None

    @property
    def listen(self) -> str:
        """The first listener's `host:port`."""
        return self.specs[0].split("=", 1)[0]

    def start(self, timeout: float = 15.0) -> None:
        """Start the process (a new one each time) and wait until it forwards."""
        process = ManagedProcess(
            name=self.name,
            argv=self._argv,
            log_path=self._log_path,
            marker=f"devstack.tcp_forward {self.specs[0]}",
        )
        self.process = process
        process.start()
        process.wait_ready(lambda: FORWARDING in process.log_tail(5), timeout=timeout)

    def alive(self) -> bool:
        return self.process is not None and self.process.alive()

    def kill(self) -> None:
        """SIGKILL the process and reap it."""
        if self.process is not None:
            self.process.kill(signal.SIGKILL)
            self.process.stop(timeout=5.0)

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: python -m devstack.tcp_forward LHOST:LPORT=THOST:TPORT ...")
    forward_main(sys.argv[1:])
