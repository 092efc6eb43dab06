"""What Spark writes outside Python's logging becomes `spark.output` events, never the
process's stdout or stderr: the line-to-level mapping, the pipe reader, PySpark's own stderr
loggers, and a driver JVM that fails to start (a stand-in `spark-submit`, no JVM)."""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from spark_bridge.jvm_output import (
    PYSPARK_STDERR_LOGGERS,
    OutputPump,
    capture_pyspark_loggers,
    line_level,
    log_line,
)
from tests.fresh import fresh_python, fresh_run

DEBUG, WARN = "debug", "warning"


@pytest.mark.parametrize(
    ("line", "level"),
    [
        ("Using Spark's default log4j profile: org/apache/spark/log4j2-defaults.properties", DEBUG),
        ('Setting default log level to "WARN".', DEBUG),
        ("WARNING: Using incubator modules: jdk.incubator.vector", DEBUG),
        ("26/11/26 19:41:39 WARN Utils: Your hostname, vm, resolves to a loopback address", DEBUG),
        ("26/11/26 19:41:39 INFO SparkContext: Running Spark version 4.3.0", DEBUG),
        ("26/11/26 19:41:40 ERROR Executor: Exception in task 0.0 in stage 1.0 (TID 1)", WARN),
        ("26/11/26 19:41:40 FATAL SparkUncaughtExceptionHandler: [Container in shutdown]", WARN),
        ("\tat org.apache.spark.executor.Executor.run(Executor.scala:620)", DEBUG),
        ('Exception in thread "dispatcher-event-loop-1" java.lang.OutOfMemoryError', WARN),
        # A Python worker's traceback: the failed task fails the flush, which says so itself.
        ("Traceback (most recent call last):", DEBUG),
        ("BrokenPipeError: [Errno 32] Broken pipe", DEBUG),
        # Spark's JSON layout (structured logging) and PySpark's query-context logger.
        ('{"ts":"2026-11-26T19:41:40.000Z","level":"ERROR","msg":"Task failed"}', WARN),
        ('{"ts": "2026-11-26 19:41:40,000", "level": "ERROR", "logger": "SQLQueryContext"}', WARN),
        ('{"ts":"2026-11-26T19:41:40.000Z","level":"WARN","msg":"slow"}', DEBUG),
        ("{not json", DEBUG),
        ("[1, 2]", DEBUG),
    ],
)
def test_a_line_is_a_warning_only_when_it_reports_an_error(line: str, level: str) -> None:
    assert line_level(line) == level


def test_log_line_writes_the_event_spark_output() -> None:
    warn = "26/11/26 19:41:39 WARN Utils: Set SPARK_LOCAL_IP"
    error = "26/11/26 19:41:40 ERROR Executor: Exception in task 0.0"
    with structlog.testing.capture_logs() as events:
        log_line(warn)
        log_line(error)
    assert [(e["event"], e["log_level"], e["line"]) for e in events] == [
        ("spark.output", "debug", warn),
        ("spark.output", "warning", error),
    ]


def test_the_pump_hands_over_every_line_until_the_pipe_closes() -> None:
    read_end, write_end = os.pipe()
    got: list[str] = []

    def output(line: str) -> None:
        got.append(line)
        if line == "fails":
            raise RuntimeError("a failing output must not stop the reading")

    pump = OutputPump(os.fdopen(read_end, "rb"), output, keep=3)
    pump.start()
    os.write(write_end, b"first\n\n   \nfails\n\tat Frame.run\r\nbad \xff byte\nno newline")
    assert [t.name for t in threading.enumerate()].count("spark-output") == 1
    os.close(write_end)
    assert pump.last_lines(timeout=5.0) == ["\tat Frame.run", "bad \ufffd byte", "no newline"]
    assert got == ["first", "fails", "\tat Frame.run", "bad \ufffd byte", "no newline"]
    assert "spark-output" not in [t.name for t in threading.enumerate()], "ends at EOF"


@pytest.fixture
def pyspark_loggers() -> Iterator[None]:
    """PySpark's stderr loggers as they were before the test."""
    from pyspark.logger import PySparkLogger

    loggers = [PySparkLogger.getLogger(name) for name in PYSPARK_STDERR_LOGGERS]
    before = [list(logger.handlers) for logger in loggers]
    yield
    for logger, handlers in zip(loggers, before, strict=True):
        logger.handlers = handlers


@pytest.mark.usefixtures("pyspark_loggers")
def test_pyspark_query_context_logs_go_to_the_output(capfd: pytest.CaptureFixture[str]) -> None:
    from pyspark.logger import PySparkLogger

    got: list[str] = []
    capture_pyspark_loggers(got.append)
    capture_pyspark_loggers(got.append)  # a retried start: still one handler
    # How PySpark logs a converted error that carries its query's context.
    logger = PySparkLogger.getLogger("SQLQueryContextLogger")
    logger.propagate = False
    logger.error("[DIVIDE_BY_ZERO] Division by zero.", errorClass="DIVIDE_BY_ZERO")
    assert len(got) == 1 and line_level(got[0]) == "warning"
    assert '"msg": "[DIVIDE_BY_ZERO] Division by zero."' in got[0]
    assert capfd.readouterr() == ("", "")


# In a fresh interpreter: PySpark keeps one driver JVM per process, and would reuse one an
# earlier test of this worker started instead of starting (and failing) its own.
_NO_JVM = """
import json, threading
from pyspark import SparkContext
from spark_bridge.runtime import SparkRuntime, SparkSettings, SparkStartError
got = []
runtime = SparkRuntime(SparkSettings(app_name="no-jvm"), output=got.append)
try:
    runtime.start()
    message = None
except SparkStartError as exc:
    message = str(exc)
threads = [t.name for t in threading.enumerate()]
print(json.dumps({"got": got, "message": message, "gateway": SparkContext._gateway is None,
                  "threads": threads}))
"""


def test_a_driver_that_does_not_start_is_an_error_with_its_last_output(tmp_path: Path) -> None:
    # A spark-submit that fails as a JVM without Java would: a line on stderr, exit 1.
    submit = tmp_path / "bin" / "spark-submit"
    submit.parent.mkdir()
    submit.write_text(
        "#!/bin/sh\necho 'WARNING: launcher notice'\n"
        "echo 'Error: JAVA_HOME is not set; password=hunter2' >&2\nexit 1\n"
    )
    submit.chmod(0o755)
    env = {"SPARK_HOME": str(tmp_path), "PYSPARK_PYTHON": sys.executable}
    done = fresh_run(_NO_JVM, timeout=120.0, env=env)
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    (printed,) = done.stdout.splitlines()  # nothing of the JVM's on the process's output
    found = json.loads(printed)
    assert found["got"] == [
        "WARNING: launcher notice",
        "Error: JAVA_HOME is not set; password=hunter2",
    ]
    assert "did not start" in found["message"]
    assert (
        "its last output: WARNING: launcher notice | Error: JAVA_HOME is not set"
        in (found["message"])
    )
    assert "hunter2" not in found["message"], "redacted"
    assert found["gateway"] is True
    assert "spark-output" not in found["threads"], "ended with the JVM"


@pytest.mark.integration
@pytest.mark.spark
def test_stop_ends_the_driver_jvm_it_started() -> None:
    # A fresh interpreter: this one may run a driver JVM already (PySpark keeps one per
    # process). The demo's test found the JVM alive after its process had returned.
    code = (
        "import os\n"
        "from pyspark import SparkContext\n"
        "from spark_bridge.runtime import SparkRuntime, SparkSettings\n"
        "runtime = SparkRuntime(SparkSettings(app_name='stop-test', driver_memory='600m'),"
        " output=lambda line: None)\n"
        "runtime.start()\n"
        "pid = SparkContext._gateway.proc.pid\n"
        "runtime.stop()\n"
        "print('RESULT', pid, os.path.exists(f'/proc/{pid}'), SparkContext._gateway is None)\n"
    )
    printed = fresh_python(code, timeout=180.0)
    (line,) = [x for x in printed.splitlines() if x.startswith("RESULT ")]
    pid, alive, forgotten = line.split()[1:]
    assert int(pid) > 0
    assert (alive, forgotten) == ("False", "True")
