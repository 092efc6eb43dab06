"""systemd's notify protocol, spoken directly (no C library): READY, WATCHDOG, STATUS, STOPPING.

Without `$NOTIFY_SOCKET` (not started by systemd with Type=notify) every call is a no-op.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass
class Notifier:
    """Sends notifications to the socket systemd gave us, if any."""

    address: str | None = None
    watchdog_usec: int | None = None
    _sock: socket.socket | None = field(default=None, init=False, repr=False)

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> Notifier:
        """A notifier for `$NOTIFY_SOCKET`; the watchdog interval if `$WATCHDOG_USEC` is ours."""
        env = os.environ if environ is None else environ
        address = env.get("NOTIFY_SOCKET") or None
        usec = env.get("WATCHDOG_USEC")
        pid = env.get("WATCHDOG_PID")
        watchdog = (
            int(usec) if usec and usec.isdigit() and (not pid or pid == str(os.getpid())) else None
        )
        return cls(address, watchdog)

    @property
    def enabled(self) -> bool:
        return self.address is not None

    @property
    def watchdog_interval(self) -> float | None:
        """Seconds between WATCHDOG=1 pings (half of systemd's timeout), or None if off."""
        return self.watchdog_usec / 2_000_000 if self.watchdog_usec else None

    def notify(self, **fields: str) -> bool:
        """Send `KEY=value` lines; True if sent. Failures are swallowed: systemd may be gone."""
        if self.address is None:
            return False
        payload = "\n".join(f"{key}={value}" for key, value in fields.items()).encode()
        target = "\0" + self.address[1:] if self.address.startswith("@") else self.address
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            self._sock.sendto(payload, target)
        except OSError:
            return False
        return True

    def ready(self, status: str) -> bool:
        return self.notify(READY="1", STATUS=status, MAINPID=str(os.getpid()))

    def watchdog(self) -> bool:
        return self.notify(WATCHDOG="1")

    def status(self, text: str) -> bool:
        return self.notify(STATUS=text)

    def stopping(self, status: str = "stopping") -> bool:
        return self.notify(STOPPING="1", STATUS=status)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
