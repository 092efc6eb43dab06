"""The local ClickHouse: chdb behind the ClickHouse HTTP interface, as a separate process.

`ClickHouseService` starts ``python -m devstack.clickhouse_http`` on a data path under
its root, waits until ``GET /ping`` answers ``Ok.``, hands out clickhouse-connect HTTP clients
and stops the process by its PID. Stopping and starting again on the same root and port keeps
the data (chdb keeps it in the data path). The front's limits are listed in
`devstack.clickhouse_http`.
"""

from __future__ import annotations

import contextlib
import ssl
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

from devstack.clickhouse_http import PASSWORD_ENV
from devstack.process import (
    LOOPBACK,
    DevstackError,
    ManagedProcess,
    ensure_port_free,
    free_port,
    port_open,
)

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

    from devstack.tls import CertificateFiles

SERVER_MODULE = "devstack.clickhouse_http"


class ClickHouseService:
    """One ClickHouse HTTP front process; `root` holds the chdb data path and the log. With
    `tls` it serves HTTPS only, with that certificate and key, and trusts its CA."""

    def __init__(
        self,
        root: Path,
        *,
        port: int | None = None,
        user: str = "default",
        password: str = "",
        tls: CertificateFiles | None = None,
    ) -> None:
        self.root = Path(root)
        self.host = LOOPBACK
        self.port = port if port is not None else free_port()
        self.user = user
        self._password = password
        self.tls = tls
        self.data_path = self.root / "data"
        self.log_path = self.root / "clickhouse_http.log"
        self._process: ManagedProcess | None = None

    @property
    def url(self) -> str:
        return f"{'http' if self.tls is None else 'https'}://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None and self._process.alive() else None

    def start(self, timeout: float = 30.0) -> None:
        """Start the front and return once it answers /ping; `DevstackError` says what failed."""
        if self._process is not None and self._process.alive():
            raise DevstackError(f"ClickHouse front on port {self.port} is already running")
        self._check_port()
        self.root.mkdir(parents=True, exist_ok=True)
        data_arg = f"--data={self.data_path.resolve()}"
        tls_args = (
            []
            if self.tls is None
            else [f"--tls-cert={self.tls.cert_file}", f"--tls-key={self.tls.key_file}"]
        )
        process = ManagedProcess(
            name=f"ClickHouse front (port {self.port})",
            argv=[
                sys.executable,
                "-m",
                SERVER_MODULE,
                f"--host={self.host}",
                f"--port={self.port}",
                data_arg,
                f"--user={self.user}",
                *tls_args,
            ],
            log_path=self.log_path,
            marker=data_arg,
            env={PASSWORD_ENV: self._password},
        )
        process.start()
        self._process = process
        process.wait_ready(self.healthy, timeout=timeout)

    def _check_port(self) -> None:
        """Refuse a port someone listens on; sockets only in TIME_WAIT do not count."""
        try:
            ensure_port_free(self.port, self.host, what="ClickHouse front")
        except DevstackError:
            if port_open(self.port, self.host):
                raise

    def stop(self) -> None:
        """Stop the front by its PID (no-op if it is not running)."""
        if self._process is not None:
            self._process.stop()

    def kill(self) -> None:
        """SIGKILL the front (fault injection) and reap it; the data path stays usable."""
        if self._process is not None and self._process.popen is not None:
            self._process.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._process.popen.wait(timeout=10.0)

    def healthy(self) -> bool:
        """True if the front answers ``GET /ping`` with ``Ok.``."""
        try:
            tls = self.tls
            context = None if tls is None else ssl.create_default_context(cafile=tls.ca_file)
            with urllib.request.urlopen(
                f"{self.url}/ping", timeout=2.0, context=context
            ) as response:
                return bool(response.status == 200 and response.read() == b"Ok.\n")
        except OSError:
            return False

    def client(self, **kwargs: Any) -> Client:
        """A clickhouse-connect HTTP client for this front; `kwargs` go to ``get_client``."""
        import clickhouse_connect

        options: dict[str, Any] = {
            "host": self.host,
            "port": self.port,
            "username": self.user,
            "password": self._password,
            "interface": "http",
        }
        if self.tls is not None:
            options.update(interface="https", secure=True, ca_cert=str(self.tls.ca_file))
        options.update(kwargs)
        return clickhouse_connect.get_client(**options)
