"""What Spark writes outside Python's logging, as log events.

The driver JVM writes to its stdout and stderr: the launcher's and the JVM's own messages,
Spark's banner and its log4j console (WARN and up), and whatever its Python workers write to
theirs, which the JVM copies to its stderr (a `BrokenPipeError` traceback when a worker's
socket closes under it). PySpark itself writes the context of a failed query to stderr as a
JSON line. `SparkRuntime(output=...)` sends all of it, line by line, to a callable instead:
the JVM's through a pipe that an `OutputPump` reads, and `log_line` is the callable that
makes each line a `spark.output` event.

Loads no pyspark at import.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import threading
from collections import deque
from collections.abc import Callable
from typing import BinaryIO

import structlog

log = structlog.get_logger("spark_bridge.jvm_output")

Output = Callable[[str], None]

# A log4j line at ERROR or FATAL in Spark's default layout (`%d{yy/MM/dd HH:mm:ss} %p ...`).
_LOG4J_ERROR = re.compile(r"\d\d/\d\d/\d\d \d\d:\d\d:\d\d (?:ERROR|FATAL) ")
_ERROR_LEVELS = frozenset({"ERROR", "FATAL", "CRITICAL"})
# How the JVM reports an exception that ended one of its threads, outside log4j.
_UNCAUGHT = "Exception in thread "
# PySpark's loggers that write to stderr through a handler of their own (on converting a
# Spark error that carries its query's context).
PYSPARK_STDERR_LOGGERS = ("DataFrameQueryContextLogger", "SQLQueryContextLogger")


def line_level(line: str) -> str:
    """The level a line of Spark's output is logged at: "warning" for an error that may
    never reach a caller (a log4j line at ERROR or FATAL, in Spark's pattern or JSON layout;
    an exception that ended a JVM thread), "debug" for everything else: banners, log4j
    WARN and below, stack frames, Python worker tracebacks (a failed task fails its job,
    and the flush raises that)."""
    if _LOG4J_ERROR.match(line) or line.startswith(_UNCAUGHT):
        return "warning"
    if line.startswith("{"):
        with contextlib.suppress(ValueError):
            record = json.loads(line)
            if isinstance(record, dict) and record.get("level") in _ERROR_LEVELS:
                return "warning"
    return "debug"


def log_line(line: str) -> None:
    """Log one line of Spark's output as the event `spark.output` (field `line`) at
    `line_level(line)`."""
    if line_level(line) == "warning":
        log.warning("spark.output", line=line)
    else:
        log.debug("spark.output", line=line)


class OutputPump:
    """Reads the lines of `stream` (a pipe a child process writes to) on a `spark-output`
    thread and hands each non-blank one to `output`, until the stream ends: when every
    process holding its write end has exited. It never stops reading before that, `output`
    failing included: a full pipe would block the writer. Keeps the last `keep` lines for
    an error message."""

    def __init__(self, stream: BinaryIO, output: Output, keep: int = 20) -> None:
        self._stream = stream
        self._output = output
        self._last: deque[str] = deque(maxlen=keep)
        self._thread = threading.Thread(target=self._run, name="spark-output", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        with self._stream:
            for raw in self._stream:
                line = raw.decode(errors="replace").rstrip()
                if not line:
                    continue
                self._last.append(line)
                with contextlib.suppress(Exception):
                    self._output(line)

    def last_lines(self, timeout: float) -> list[str]:
        """The last lines read, once the stream ended or `timeout` s passed."""
        self._thread.join(timeout)
        return list(self._last)


class _ToOutput(logging.Handler):
    """A logging handler that hands each formatted record, line by line, to `output`."""

    def __init__(self, output: Output) -> None:
        super().__init__()
        self._output = output

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record)
        except Exception:
            self.handleError(record)
            return
        for line in text.splitlines():
            self._output(line)


def capture_pyspark_loggers(output: Output) -> None:
    """Make PySpark's loggers that write to stderr themselves (`PYSPARK_STDERR_LOGGERS`)
    hand their lines (JSON, as PySpark formats them) to `output` instead."""
    from pyspark.logger import PySparkLogger

    for name in PYSPARK_STDERR_LOGGERS:
        logger = PySparkLogger.getLogger(name)
        logger.handlers.clear()
        logger.addHandler(_ToOutput(output))  # PySparkLogger sets its JSON formatter
