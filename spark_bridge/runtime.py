"""The long-lived SparkSession of one daemon: started once, reused by every flush, stopped.

Secrets stay out of `ps`, logs and errors. PySpark starts its driver JVM as `spark-submit`
with every builder setting as a `--conf key=value` argument, readable by any local user in
the process list; so the settings (with `[spark.conf]`) go to spark-submit in a properties
file instead, mode 0600 in a private temporary directory that is deleted once the JVM is up.
(The launcher still turns `spark.driver.extraJavaOptions` and `spark.driver.memory` into JVM
arguments: no secret belongs in those.)
A Spark Connect URL (`;token=...`) is logged and quoted in errors only through `redact`.

With `output`, what Spark writes outside Python's logging goes to that callable, line by line
(`jvm_output`): the driver JVM is started with its stdout and stderr on a pipe read by a
`spark-output` thread, and PySpark's own stderr loggers are redirected. Without it the JVM
writes to this process's stdout and stderr.

Where the flush's handoff serves (`handoff_address`) travels in the session's own conf
(`spark.hakafka.handoff.host`, `.bind`), so a flush reads it from the session it is given,
classic or Spark Connect.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from chlib.connection import is_loopback
from spark_bridge.jvm_output import Output, OutputPump, capture_pyspark_loggers
from spark_bridge.redact import redact

if TYPE_CHECKING:
    from pyspark import SparkConf
    from pyspark.sql import SparkSession

log = structlog.get_logger("spark_bridge.runtime")

LOOPBACK = "127.0.0.1"
JIT_C1_ONLY = "-XX:TieredStopAtLevel=1"
# The driver waits warm on every follower (`[spark] on_followers`) and only schedules: the
# serial collector on a small initial heap that shrinks back after a flush. Measured on an
# idle follower: 240 MiB resident, against 340 MiB with G1's defaults.
DRIVER_FOOTPRINT = "-XX:+UseSerialGC -Xms32m -XX:MinHeapFreeRatio=10 -XX:MaxHeapFreeRatio=30"
# The host Spark tasks fetch block slices from, and the address the handoff listens on.
HANDOFF_HOST_CONF = "spark.hakafka.handoff.host"
HANDOFF_BIND_CONF = "spark.hakafka.handoff.bind"

# PySpark's flag that this process is in Spark Connect mode: a Connect session sets it, and
# while it is set every new session (a classic one too, in this process or its children) is
# a Connect one. `SparkRuntime` puts it back as it found it when its session is gone.
CONNECT_MODE_ENV = "SPARK_CONNECT_MODE_ENABLED"
DRIVER_EXIT_S = 30.0  # how long `stop` waits for a driver JVM it started to end

# Runtime SQL settings the bridge relies on; `prepare_session` sets them on any session.
SESSION_SQL_CONF: Mapping[str, str] = {
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.python.filterPushdown.enabled": "true",
}


class SparkStartError(RuntimeError):
    """The SparkSession could not be started; the text names where, secrets redacted."""


@dataclass(frozen=True)
class SparkSettings:
    """Where and how Spark runs. `remote` (a Spark Connect URL) wins over `master`.

    `handoff_host` is the address Spark's tasks reach this process's slice handoff at (None:
    the driver's host with a classic session, 127.0.0.1 with Spark Connect), `handoff_bind`
    the address the handoff listens on (None: `handoff_host`). `conf` is passed through last,
    so it overrides every default chosen here. `remote` and `conf` may hold secrets: they are
    left out of the repr.
    """

    master: str = "local[2]"
    remote: str | None = field(default=None, repr=False)
    app_name: str = "hakafka"
    driver_memory: str = "2g"
    conf: Mapping[str, str] = field(default_factory=dict, repr=False)
    ui_enabled: bool = False
    handoff_host: str | None = None
    handoff_bind: str | None = None

    @property
    def where(self) -> str:
        """The master, or the Spark Connect URL with its secrets redacted: for logs."""
        return self.master if self.remote is None else redact(self.remote)

    def spark_conf(self) -> dict[str, str]:
        """The full Spark configuration the session is built with."""
        conf: dict[str, str] = {
            # Large Arrow batches: fewer JVM <-> Python round trips per task.
            "spark.sql.execution.arrow.maxRecordsPerBatch": "200000",
            **SESSION_SQL_CONF,
        }
        # The rest configure a driver; a Spark Connect server refuses them from a session.
        if self.remote is None:
            conf["spark.ui.enabled"] = str(self.ui_enabled).lower()
            conf["spark.ui.showConsoleProgress"] = "false"
            conf["spark.python.worker.reuse"] = "true"
            # Workers forked with the flush's modules loaded (see `worker_daemon`).
            conf["spark.python.daemon.module"] = "spark_bridge.worker_daemon"
            # JVM <-> Python worker over a Unix socket: over TCP every task waited out a
            # delayed ACK (40 of the 80 ms of a one-task job here).
            conf["spark.python.unix.domain.socket.enabled"] = "true"
            # A flush's JVMs only schedule (the rows go from the handoff to the Python
            # workers), and C2's compiles cost them three times the CPU of that scheduling.
            # Heavy JVM-side transforms may want C2 back: `[spark.conf]` overrides these.
            conf["spark.driver.extraJavaOptions"] = f"{JIT_C1_ONLY} {DRIVER_FOOTPRINT}"
            conf["spark.executor.extraJavaOptions"] = JIT_C1_ONLY
            # The Python workers account no memory, so their Arrow pool is mimalloc, which
            # keeps freed pages for the next flush; jemalloc (the daemon's pool, for its RSS
            # accounting) handed them back to be faulted in again: twice their CPU per MiB.
            conf["spark.executorEnv.ARROW_DEFAULT_MEMORY_POOL"] = "mimalloc"
            conf["spark.driver.memory"] = self.driver_memory
            # Executors' Python must be the driver's (same packages, editable installs).
            conf["spark.pyspark.python"] = sys.executable
            if _on_loopback(self.master):
                conf["spark.driver.host"] = LOOPBACK
                conf["spark.driver.bindAddress"] = LOOPBACK
        # A Connect server's driver is not this process: its host is no default for ours.
        handoff = self.handoff_host or (LOOPBACK if self.remote is not None else None)
        if handoff:
            conf[HANDOFF_HOST_CONF] = handoff
        if self.handoff_bind:
            conf[HANDOFF_BIND_CONF] = self.handoff_bind
        conf.update(self.conf)
        return conf


def _on_loopback(master: str) -> bool:
    """Whether `master` runs on this host's loopback: local mode or a standalone master at
    127.0.0.1/localhost (the dev stack's), whose executors then reach the driver there."""
    host = master.removeprefix("spark://").split(":", 1)[0]
    return master.startswith("local") or is_loopback(host)


def handoff_address(spark: SparkSession) -> tuple[str, str]:
    """``(host, bind)`` of the slice handoff for flushes through `spark`: the host its tasks
    connect to (`HANDOFF_HOST_CONF`, else the driver's host) and the address to listen on
    (`HANDOFF_BIND_CONF`, else that host)."""
    host = spark.conf.get(HANDOFF_HOST_CONF, None) or spark.conf.get("spark.driver.host", None)
    host = host or LOOPBACK
    return host, spark.conf.get(HANDOFF_BIND_CONF, None) or host


def prepare_session(spark: SparkSession) -> None:
    """Make `spark` ready for the bridge: runtime SQL settings, the `hakafka_clickhouse`
    source and the `hakafka` sink (pushes into pipelines' buffers)."""
    from spark_bridge.datasource import ClickHouseDataSource
    from spark_bridge.push_sink import PushDataSource

    for key, value in SESSION_SQL_CONF.items():
        spark.conf.set(key, value)
    spark.dataSource.register(ClickHouseDataSource)
    spark.dataSource.register(PushDataSource)


class SparkRuntime:
    """One SparkSession for the process; `start` is idempotent, `stop` ends it cleanly.

    `output`, when given, receives each line Spark writes outside Python's logging: the
    driver JVM's stdout and stderr (its log4j console, its Python workers' stderr) and
    PySpark's query-context log lines (see `jvm_output`); None leaves them on this process's
    stdout and stderr.
    """

    def __init__(self, settings: SparkSettings | None = None, output: Output | None = None) -> None:
        self.settings = settings or SparkSettings()
        self._output = output
        self._session: SparkSession | None = None
        self._driver: subprocess.Popen[bytes] | None = None  # a driver JVM this runtime started
        self._lock = threading.Lock()
        self._connect_mode_before = os.environ.get(CONNECT_MODE_ENV)

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
            if self._output is not None:
                capture_pyspark_loggers(self._output)
            session = self._connect() if self.settings.remote else self._launch()
            prepare_session(session)
            self._session = session
            log.info("spark.started", master=self.settings.where, version=session.version)
            return session

    def _connect(self) -> SparkSession:
        """A Spark Connect session; its settings travel inside the session, never in argv."""
        from pyspark.sql import SparkSession

        builder: Any = SparkSession.builder.appName(self.settings.app_name)
        builder = builder.remote(self.settings.remote)
        for key, value in self.settings.spark_conf().items():
            builder = builder.config(key, value)
        self._connect_mode_before = os.environ.get(CONNECT_MODE_ENV)
        try:
            session: SparkSession = builder.getOrCreate()
        except Exception as exc:
            _set_env(CONNECT_MODE_ENV, self._connect_mode_before)
            # PySpark quotes the URL (with its token) in its errors.
            raise SparkStartError(
                f"cannot start a Spark Connect session at {self.settings.where}: {redact(str(exc))}"
            ) from None
        return session

    def _launch(self) -> SparkSession:
        """A classic session whose driver JVM gets its settings from a private properties
        file (`--properties-file`), not from `--conf` arguments in its command line."""
        from pyspark.sql import SparkSession

        conf = self.settings.spark_conf()
        # PySpark picks the executors' Python from the environment, not from conf.
        os.environ.setdefault("PYSPARK_PYTHON", conf["spark.pyspark.python"])
        builder: Any = SparkSession.builder.appName(self.settings.app_name)
        builder = builder.master(self.settings.master)
        with tempfile.TemporaryDirectory(prefix="hakafka-spark-") as private:  # mode 0700
            properties = write_properties(Path(private) / "spark.properties", conf)
            with _submit_args("--properties-file", str(properties), "--load-spark-defaults"):
                if self._output is not None:
                    self._start_driver(self._output)
                session: SparkSession = builder.getOrCreate()
        return session

    def _start_driver(self, output: Output) -> None:
        """Start the driver JVM (from PYSPARK_SUBMIT_ARGS, as PySpark would) with its stdout
        and stderr on a pipe whose lines an `OutputPump` hands to `output`, and make it the
        gateway of the process's SparkContext. Nothing if PySpark already has a driver JVM:
        it keeps one per process, across sessions. SparkStartError, with the JVM's last
        lines, if it exits before it serves."""
        from pyspark import SparkConf, SparkContext

        if SparkContext._gateway is not None:
            return
        # What PySpark's builder passes spark-submit as `--conf`: no secret among them.
        conf = SparkConf().setAppName(self.settings.app_name).setMaster(self.settings.master)
        # A pipe of our own rather than Popen's: it is read from before the JVM starts,
        # so the JVM never blocks on a full pipe while PySpark waits for it to serve.
        read_end, write_end = os.pipe()
        pump = OutputPump(os.fdopen(read_end, "rb"), output)
        pump.start()
        try:
            gateway = _launch_gateway(conf, write_end)
        except Exception as exc:
            last = " | ".join(pump.last_lines(timeout=5.0)[-5:])
            raise SparkStartError(
                redact(f"the Spark driver JVM did not start ({exc}); its last output: {last}")
            ) from None
        SparkContext(conf=conf, gateway=gateway)
        self._driver = gateway.proc

    def stop(self) -> None:
        """Stop the session (no-op if not started); a driver JVM this runtime started ends
        with it (waited for); after a Spark Connect session the process is out of Connect
        mode again."""
        with self._lock:
            if self._session is None:
                return
            self._session.stop()
            self._session = None
            if self._driver is not None:
                _end_driver(self._driver)
                self._driver = None
            if self.settings.remote:
                _set_env(CONNECT_MODE_ENV, self._connect_mode_before)
            log.info("spark.stopped")

    def __enter__(self) -> SparkSession:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _end_driver(driver: subprocess.Popen[bytes]) -> None:
    """End a driver JVM started by `_start_driver` and wait for it (SIGKILL past
    `DRIVER_EXIT_S`), so that nothing of it outlives `stop`; the next session starts a new
    one. PySpark's JVM exits when its stdin closes (it does so when this process ends too,
    but a moment later, after whoever waited for this process went on)."""
    from pyspark import SparkContext

    if driver.stdin is not None:
        with contextlib.suppress(OSError):
            driver.stdin.close()
    try:
        driver.wait(timeout=DRIVER_EXIT_S)
    except subprocess.TimeoutExpired:
        driver.kill()
        driver.wait(timeout=5.0)
    SparkContext._gateway = None
    SparkContext._jvm = None


def _launch_gateway(conf: SparkConf, out: int) -> Any:
    """PySpark's py4j gateway to a new driver JVM whose stdout and stderr are the file
    descriptor `out`; closes `out` (the JVM keeps its own copy, so a reader of the pipe sees
    its end when the JVM exits)."""
    from pyspark.java_gateway import launch_gateway

    try:
        return launch_gateway(  # type: ignore[no-untyped-call]
            conf, popen_kwargs={"stdout": out, "stderr": subprocess.STDOUT}
        )
    finally:
        os.close(out)


def write_properties(path: Path, conf: Mapping[str, str]) -> Path:
    """Write `conf` to a new file `path` (mode 0600) in Java properties syntax, as UTF-8
    (how spark-submit reads it); returns `path`. Spark trims each value's outer spaces."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        for key, value in conf.items():
            out.write(f"{_escape(key)}={_escape(value)}\n")
    return path


# Characters with a meaning in a properties file, written escaped.
_ESCAPES = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\f": "\\f"} | {
    c: f"\\{c}" for c in " =:#!"
}


def _escape(text: str) -> str:
    return "".join(_ESCAPES.get(c, c) for c in text)


@contextlib.contextmanager
def _submit_args(*args: str) -> Iterator[None]:
    """PYSPARK_SUBMIT_ARGS (what PySpark passes to spark-submit) with `args` in front while
    the block runs; restored after."""
    name = "PYSPARK_SUBMIT_ARGS"
    before = os.environ.get(name)
    os.environ[name] = " ".join([*map(shlex.quote, args), before or "pyspark-shell"])
    try:
        yield
    finally:
        _set_env(name, before)


def _set_env(name: str, value: str | None) -> None:
    """Set the environment variable `name` to `value`, or unset it for None."""
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value
