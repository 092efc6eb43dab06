"""The long-lived SparkSession of one daemon: started once, reused by every flush, stopped."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import structlog

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = structlog.get_logger("spark_bridge.runtime")

LOOPBACK = "127.0.0.1"

# Runtime SQL settings the bridge relies on; `prepare_session` sets them on any session.
SESSION_SQL_CONF: Mapping[str, str] = {
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.python.filterPushdown.enabled": "true",
}


@dataclass(frozen=True)
class SparkSettings:
    """Where and how Spark runs. `remote` (a Spark Connect URL) wins over `master`.

    `conf` is passed through last, so it overrides every default chosen here.
    """

    master: str = "local[2]"
    remote: str | None = None
    app_name: str = "hakafka"
    driver_memory: str = "2g"
    conf: Mapping[str, str] = field(default_factory=dict)
    ui_enabled: bool = False

    def spark_conf(self) -> dict[str, str]:
        """The full Spark configuration the session is built with."""
        conf: dict[str, str] = {
            "spark.ui.enabled": str(self.ui_enabled).lower(),
            "spark.ui.showConsoleProgress": "false",
            # Large Arrow batches: fewer JVM <-> Python round trips per task.
            "spark.sql.execution.arrow.maxRecordsPerBatch": "200000",
            "spark.python.worker.reuse": "true",
            **SESSION_SQL_CONF,
        }
        if self.remote is None:
            conf["spark.driver.memory"] = self.driver_memory
            # Executors' Python must be the driver's (same packages, editable installs).
            conf["spark.pyspark.python"] = sys.executable
            if self.master.startswith("local"):
                conf["spark.driver.host"] = LOOPBACK
                conf["spark.driver.bindAddress"] = LOOPBACK
        conf.update(self.conf)
        return conf


def prepare_session(spark: SparkSession) -> None:
    """Make `spark` ready for the bridge: runtime SQL settings and the `clickhouse` source."""
    from spark_bridge.datasource import ClickHouseDataSource

    for key, value in SESSION_SQL_CONF.items():
        spark.conf.set(key, value)
    spark.dataSource.register(ClickHouseDataSource)


class SparkRuntime:
    """One SparkSession for the process; `start` is idempotent, `stop` ends it cleanly."""

    def __init__(self, settings: SparkSettings | None = None) -> None:
        self.settings = settings or SparkSettings()
        self._session: SparkSession | None = None
        self._lock = threading.Lock()

    @property
    def session(self) -> SparkSession:
        """The running session; RuntimeError if `start` was not called."""
        if self._session is None:
            raise RuntimeError("SparkRuntime is not started")
        return self._session

    def start(self) -> SparkSession:
        """Start the session once (later calls return the same one)."""
        with self._lock:
            if self._session is not None:
                return self._session
            from pyspark.sql import SparkSession

            builder: Any = SparkSession.builder.appName(self.settings.app_name)
            if self.settings.remote is not None:
                builder = builder.remote(self.settings.remote)
            else:
                builder = builder.master(self.settings.master)
                # PySpark picks the executors' Python from the environment, not from conf.
                os.environ.setdefault(
                    "PYSPARK_PYTHON", self.settings.spark_conf()["spark.pyspark.python"]
                )
            for key, value in self.settings.spark_conf().items():
                builder = builder.config(key, value)
            session: SparkSession = builder.getOrCreate()
            prepare_session(session)
            self._session = session
            log.info(
                "spark.started",
                master=self.settings.remote or self.settings.master,
                version=session.version,
            )
            return session

    def stop(self) -> None:
        """Stop the session (no-op if not started)."""
        with self._lock:
            if self._session is None:
                return
            self._session.stop()
            self._session = None
            log.info("spark.stopped")

    def __enter__(self) -> SparkSession:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
