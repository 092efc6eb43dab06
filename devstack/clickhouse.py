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
    ManagedProcess,
    ManagedService,
    free_port,
)

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

    from devstack.tls import CertificateFiles

SERVER_MODULE = "devstack.clickhouse_http"


class ClickHouseService(ManagedService):
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
        super().__init__()
        self.root = Path(root)
        self.host = LOOPBACK
        self.port = port if port is not None else free_port()
        self.user = user
        self._password = password
        self.tls = tls
        self.data_path = self.root / "data"
        self.log_path = self.root / "clickhouse_http.log"

    @property
    def url(self) -> str:
        return f"{'http' if self.tls is None else 'https'}://{self.host}:{self.port}"

    def start(self, timeout: float = 30.0) -> None:
        """Start the front and return once it answers /ping; `DevstackError` says what failed."""
        self._refuse_busy(self.port, self.host, what="ClickHouse front")
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
        self._launch(process, self.healthy, timeout)

    def kill(self) -> None:
        """SIGKILL the front (fault injection) and reap it; the data path stays usable."""
        if self.process is not None and self.process.popen is not None:
            self.process.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.popen.wait(timeout=10.0)

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
