"""Spark clusters for the local stack, from PySpark's own jars: a standalone cluster (a master
and one worker, separate JVMs) and a Spark Connect server.

Each JVM is started through PySpark's `bin/spark-class` (which `exec`s java with the module
options Spark needs, so the PID we record is the JVM's), bound to 127.0.0.1 on free ports
(`SPARK_LOCAL_IP` binds the web UIs there too), with a properties file under its own root
directory that names it in its command line: `stop` ends exactly that PID. Executors and the
Connect server's Python workers run the venv's Python (`PYSPARK_PYTHON`), so they import
`spark_bridge` as the daemon does.
"""

from __future__ import annotations

import json
import sys
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from devstack.process import (
    LOOPBACK,
    ManagedProcess,
    ManagedService,
    ensure_port_free,
    free_port,
    port_open,
)
from devstack.zookeeper import java_binary, pyspark_jars_dir

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
CONNECT_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
SUBMIT_CLASS = "org.apache.spark.deploy.SparkSubmit"


def spark_home() -> Path:
    """The pip-installed PySpark package, which is a SPARK_HOME (bin/, jars/)."""
    return pyspark_jars_dir().parent


def _spark_env(root: Path, daemon_memory: str) -> dict[str, str]:
    java_binary()  # a clear error when there is no java
    return {
        "SPARK_HOME": str(spark_home()),
        "SPARK_LOCAL_IP": LOOPBACK,
        "SPARK_DAEMON_MEMORY": daemon_memory,
        "SPARK_LOG_DIR": str(root),
        "SPARK_CONF_DIR": str(root),  # no spark-defaults.conf from elsewhere
        "PYSPARK_PYTHON": sys.executable,
    }


def _write_properties(path: Path, conf: Mapping[str, str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{key}={value}\n" for key, value in conf.items()))
    return path


def master_state(web_port: int, timeout: float = 2.0) -> dict[str, object]:
    """The master's `/json/` status: its URL, workers and applications."""
    url = f"http://{LOOPBACK}:{web_port}/json/"
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        state: dict[str, object] = json.loads(resp.read())
    return state


class SparkStandalone:
    """A standalone master and one worker (`cores`, `memory`: two executors of Spark's
    default 1 GiB) on 127.0.0.1."""

    def __init__(
        self, root: Path, *, cores: int = 2, memory: str = "2g", daemon_memory: str = "256m"
    ) -> None:
        self.root = root
        self.cores = cores
        self.memory = memory
        self.daemon_memory = daemon_memory
        self.port = free_port()
        self.web_port = free_port()
        self.master: ManagedProcess | None = None
        self.worker: ManagedProcess | None = None

    @property
    def url(self) -> str:
        """The master URL applications connect to: `spark://127.0.0.1:<port>`."""
        return f"spark://{LOOPBACK}:{self.port}"

    @property
    def pid(self) -> int | None:
        """The master's PID (the worker's is `worker.pid`)."""
        return self.master.pid if self.master is not None else None

    def _jvm(self, name: str, main_class: str, args: list[str]) -> ManagedProcess:
        properties = _write_properties(
            self.root / name / "spark.properties",
            {
                "spark.master.rest.enabled": "false",  # else a fixed port, 6066
                # An application gets one core unless it asks for more (spark.cores.max): two
                # daemons (a dying leader's app and its successor's) fit on the one worker.
                "spark.deploy.defaultCores": "1",
            },
        )
        process = ManagedProcess(
            name=f"Spark {name}",
            argv=[
                str(spark_home() / "bin" / "spark-class"),
                main_class,
                *args,
                "--properties-file",
                str(properties),
            ],
            log_path=self.root / name / f"{name}.log",
            marker=str(properties),
            env=_spark_env(self.root / name, self.daemon_memory),
        )
        process.start()
        return process

    def start(self, timeout: float = 60.0) -> None:
        """Start the master, then the worker; return once the master counts the worker alive.
        A failure stops whatever was started, by PID."""
        ensure_port_free(self.port, what="Spark master")
        try:
            self.master = self._jvm(
                "master",
                MASTER_CLASS,
                ["--host", LOOPBACK, "--port", str(self.port), "--webui-port", str(self.web_port)],
            )
            self.master.wait_ready(lambda: port_open(self.port), timeout=timeout)
            work = self.root / "worker" / "work"
            work.mkdir(parents=True, exist_ok=True)
            self.worker = self._jvm(
                "worker",
                WORKER_CLASS,
                [
                    self.url,
                    "--host",
                    LOOPBACK,
                    "--webui-port",
                    str(free_port()),
                    "--cores",
                    str(self.cores),
                    "--memory",
                    self.memory,
                    "--work-dir",
                    str(work),
                ],
            )
            self.worker.wait_ready(self.alive_workers_ready, timeout=timeout)
        except BaseException:
            self.stop()
            raise

    def alive_workers_ready(self) -> bool:
        """True once the master counts one alive worker."""
        return master_state(self.web_port).get("aliveworkers") == 1

    def stop(self) -> None:
        """Stop the worker (its executors end with it), then the master, by PID."""
        for process in (self.worker, self.master):
            if process is not None:
                process.stop()


class SparkConnectServer(ManagedService):
    """A Spark Connect server (`master`, default its own `local[2]`) on 127.0.0.1."""

    def __init__(self, root: Path, *, master: str = "local[2]", driver_memory: str = "1g") -> None:
        super().__init__()
        self.root = root
        self.master = master
        self.driver_memory = driver_memory
        self.port = free_port()

    @property
    def url(self) -> str:
        """The Spark Connect URL clients use: `sc://127.0.0.1:<port>`."""
        return f"sc://{LOOPBACK}:{self.port}"

    def start(self, timeout: float = 90.0) -> None:
        """Start the server; return once it accepts connections (stopped on failure)."""
        ensure_port_free(self.port, what="Spark Connect server")
        properties = _write_properties(
            self.root / "spark.properties",
            {
                "spark.connect.grpc.binding.address": LOOPBACK,
                "spark.connect.grpc.binding.port": str(self.port),
                "spark.driver.host": LOOPBACK,
                "spark.driver.bindAddress": LOOPBACK,
                "spark.pyspark.python": sys.executable,
                "spark.ui.enabled": "false",
                "spark.python.worker.reuse": "true",
                # As hakafka's own sessions have them (spark_bridge.runtime): workers forked
                # with the flush's modules loaded, no delayed ACKs.
                "spark.python.daemon.module": "spark_bridge.worker_daemon",
                "spark.python.unix.domain.socket.enabled": "true",
                "spark.sql.warehouse.dir": str(self.root / "warehouse"),
            },
        )
        process = ManagedProcess(
            name="Spark Connect server",
            argv=[
                str(spark_home() / "bin" / "spark-class"),
                SUBMIT_CLASS,
                "--master",
                self.master,
                "--driver-memory",
                self.driver_memory,
                "--properties-file",
                str(properties),
                "--class",
                CONNECT_CLASS,
                "--name",
                "hakafka-dev-connect",
                "spark-internal",
            ],
            log_path=self.root / "connect.log",
            marker=str(properties),
            env=_spark_env(self.root, self.driver_memory),
            cwd=self.root,
        )
        self._launch(process, lambda: port_open(self.port), timeout)


# Each mode by the name of its main recorded service.
SPARK_SERVICE = {"standalone": "spark_master", "connect": "spark_connect"}


def _port_of(endpoint: str) -> int:
    return int(endpoint.rsplit(":", 1)[1])


def _listening(endpoint: str) -> bool:
    return port_open(_port_of(endpoint))


def _worker_alive(master_ui: str) -> bool:
    aliveworkers = master_state(_port_of(master_ui)).get("aliveworkers", 0)
    return isinstance(aliveworkers, int) and aliveworkers >= 1


# Health per recorded service name (`python -m devstack status`): the worker is healthy while
# the master, whose web UI is its recorded endpoint, counts it alive.
SPARK_HEALTH: dict[str, Callable[[str], bool]] = {
    "spark_master": _listening,
    "spark_worker": _worker_alive,
    "spark_connect": _listening,
}


def start_spark(
    root: Path, modes: Sequence[str], *, timeout: float = 90.0
) -> list[tuple[str, int | None, str, str]]:
    """Start the Spark services of `modes` (keys of `SPARK_SERVICE`) under `root`, healthy;
    ``(name, pid, endpoint, env var)`` of each process. If one fails, the others started here
    are stopped by PID before the error propagates."""
    unknown = sorted(set(modes) - set(SPARK_SERVICE))
    if unknown:
        raise ValueError(f"unknown Spark mode {unknown}: choose from {', '.join(SPARK_SERVICE)}")
    started: list[SparkStandalone | SparkConnectServer] = []
    found: list[tuple[str, int | None, str, str]] = []
    try:
        if "standalone" in modes:
            standalone = SparkStandalone(root / "spark-standalone")
            started.append(standalone)
            standalone.start(timeout=timeout)
            worker = standalone.worker.pid if standalone.worker is not None else None
            ui = f"http://{LOOPBACK}:{standalone.web_port}"
            found.append(("spark_master", standalone.pid, standalone.url, "HAKAFKA_SPARK_MASTER"))
            found.append(("spark_worker", worker, ui, "HAKAFKA_SPARK_MASTER_UI"))
        if "connect" in modes:
            connect = SparkConnectServer(root / "spark-connect")
            started.append(connect)
            connect.start(timeout=timeout)
            found.append(("spark_connect", connect.pid, connect.url, "HAKAFKA_SPARK_REMOTE"))
    except BaseException:
        for service in reversed(started):
            service.stop()
        raise
    return found
