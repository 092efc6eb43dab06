"""A local S3 (moto's server) so the broker can keep its data across restarts."""

from __future__ import annotations

import sys
import urllib.request
from pathlib import Path

from devstack.process import LOOPBACK, ManagedProcess, ManagedService, ensure_port_free, free_port

REGION = "us-east-1"
# moto accepts any credentials; these only have to be present and consistent.
ACCESS_KEY = "hakafka-dev"
SECRET_KEY = "hakafka-dev-secret"


class MotoS3(ManagedService):
    """moto's S3 server on 127.0.0.1, state in memory for the life of the process."""

    def __init__(self, root: Path, *, port: int | None = None) -> None:
        super().__init__()
        self.root = root
        self.port = port or free_port()

    @property
    def endpoint(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def client_env(self) -> dict[str, str]:
        """Environment for an S3 client (tansu's object store) pointed at this server."""
        return {
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_REGION": REGION,
            "AWS_ENDPOINT": self.endpoint,
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ALLOW_HTTP": "true",
        }

    def start(self, timeout: float = 30.0) -> None:
        """Start the server and wait until it answers; one that does not within `timeout` s
        is stopped (`ManagedProcess.wait_ready`)."""
        ensure_port_free(self.port, what="moto S3 server")
        self.root.mkdir(parents=True, exist_ok=True)
        process = ManagedProcess(
            name="moto S3 server",
            argv=[sys.executable, "-m", "moto.server", "-H", LOOPBACK, "-p", str(self.port)],
            log_path=self.root / "moto.log",
            marker="moto.server",
        )
        self._launch(process, self.healthy, timeout)

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=1.0) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    def ensure_bucket(self, bucket: str) -> None:
        """Create `bucket` if it does not exist yet."""
        request = urllib.request.Request(f"{self.endpoint}/{bucket}", method="PUT")
        with urllib.request.urlopen(request, timeout=5.0):
            pass
