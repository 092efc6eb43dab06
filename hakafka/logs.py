"""Logging setup: structlog events as JSON lines (default) or human console lines.

Logs go to stdout (the journal under systemd) or to a file that SIGHUP reopens, so
logrotate can move it away. When stdout is the journal (systemd names its stream in
`JOURNAL_STREAM`), each line starts with its syslog priority (`<3>` for errors, as sd-daemon's
`SD_ERR`): journald strips it and files the line under that priority, so `journalctl -p err`
finds the errors.

Libraries write there too, never to the process's stdout or stderr on their own: stdlib
loggers (kazoo, py4j) at WARNING and up through the same renderer; libraries whose every
line is noise to an operator through `library_logger`, as debug events (librdkafka's log,
Python warnings). Spark's output is `spark_bridge.jvm_output`'s.

That is the daemon's setup (`configure`). An operator command keeps its stdout for its
results and writes its log lines to stderr (`configure_stderr`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import threading
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import IO, Any

import structlog

FORMATS = ("json", "console")


class LogLevel(StrEnum):
    """The least severe level that is written (`log_level`; SIGHUP applies a change)."""

    DEBUG = "debug"
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


_SEVERITY = {"debug": 10, "info": 20, "warning": 30, "error": 40, "exception": 40, "critical": 50}
# syslog priorities of structlog's level names (journald reads them from a `<N>` prefix).
_PRIORITIES = {"critical": 2, "exception": 3, "error": 3, "warning": 4, "info": 6, "debug": 7}
_STAMP = structlog.processors.TimeStamper(fmt="iso", utc=True)


def is_journal(stream: IO[str]) -> bool:
    """True when `stream` is the journal stream systemd connected (`JOURNAL_STREAM` holds its
    device and inode)."""
    try:
        device, inode = (int(part) for part in os.environ.get("JOURNAL_STREAM", "").split(":"))
        found = os.fstat(stream.fileno())
    except (ValueError, OSError):
        return False
    return (found.st_dev, found.st_ino) == (device, inode)


def priority_prefix(level: str) -> str:
    """The `<N>` prefix that files a line under `level`'s syslog priority in the journal."""
    return f"<{_PRIORITIES.get(level, 6)}>"


class _JournalPriority:
    """A renderer that prefixes `inner`'s line with the event's syslog priority."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __call__(self, logger: Any, name: str, event: dict[str, Any]) -> str:
        return priority_prefix(str(event.get("level", name))) + str(
            self._inner(logger, name, event)
        )


class _ToDebugEvents(logging.Handler):
    """Writes each record as the structlog debug event `event`: `line` is its message,
    `library_level` the level the library gave it."""

    def __init__(self, event: str) -> None:
        super().__init__()
        self._event = event
        self._log = structlog.get_logger("hakafka.logs")

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = record.getMessage()
        except Exception:
            self.handleError(record)
            return
        self._log.debug(self._event, line=line, library_level=record.levelname.lower())


def library_logger(name: str, event: str) -> logging.Logger:
    """The stdlib logger `name`, made to write each of its records (any level) as the debug
    event `event`, in the sink and format of every event, and nothing to the root logger's
    handler. For a library whose lines tell an operator nothing hakafka does not say itself
    (librdkafka repeats a failed connection ~20 times a second)."""
    logger = logging.getLogger(name)
    logger.handlers = [_ToDebugEvents(event)]
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    return logger


class LogSink:
    """Where log lines go; `reopen()` re-opens a file after rotation."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._stream: IO[str] = self._open()
        self.level = LogLevel.INFO
        """The least severe level written; `configure` sets it, a reload may change it."""
        self.journal = is_journal(self._stream)
        """Lines go to the journal: each starts with its priority."""

    def _open(self) -> IO[str]:
        if self.path is None:
            return sys.stdout
        return open(self.path, "a", encoding="utf-8", buffering=1)

    def write(self, text: str) -> None:
        with self._lock:
            self._stream.write(text)

    def flush(self) -> None:
        with self._lock:
            self._stream.flush()

    def emergency(self, event: str, level: str, **fields: object) -> None:
        """Write one JSON event line without taking any lock, so it cannot deadlock in a
        signal handler or while a stuck thread holds the sink; never raises."""
        stamp = datetime.now(UTC).isoformat().replace("+00:00", "Z")
        line = json.dumps({"event": event, "level": level, "timestamp": stamp, **fields})
        if self.journal:
            line = priority_prefix(level) + line
        with contextlib.suppress(OSError, ValueError):
            os.write(self._stream.fileno(), (line + "\n").encode())

    def reopen(self) -> None:
        if self.path is None:
            return
        with self._lock:
            old, self._stream = self._stream, self._open()
            old.close()


def configure(fmt: str = "json", level: str = "info", sink: LogSink | None = None) -> LogSink:
    """Configure structlog once per process; stdlib loggers (kazoo, py4j) write WARNING and
    up through the same renderer to the same sink, so every line has one format, and Python
    warnings are debug events (`python.warning`). Events below the sink's `level` are
    dropped; changing it takes effect at once. For the daemon (`hakafka run`); an operator
    command's process calls `configure_stderr` instead."""
    if fmt not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    out = sink or LogSink()
    out.level = LogLevel(level)

    def below_level(_logger: Any, name: str, event: Any) -> Any:
        if _SEVERITY.get(name, 20) < _SEVERITY[out.level]:
            raise structlog.DropEvent
        return event

    renderer: Any = structlog.processors.JSONRenderer() if fmt == "json" else _console()
    if out.journal:
        renderer = _JournalPriority(renderer)
    _configure_structlog(
        [
            below_level,
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            _STAMP,
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        out,
        logging.DEBUG,  # `below_level` filters: a reload may lower the level
        cache=True,
    )
    handler = logging.StreamHandler(out)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
            foreign_pre_chain=[
                structlog.stdlib.add_logger_name,
                structlog.processors.add_log_level,
                _STAMP,
                structlog.processors.format_exc_info,
            ],
        )
    )
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(logging.WARNING)
    # Else `warnings` writes to stderr: a library's deprecation notes, PySpark's shutdown note.
    logging.captureWarnings(True)
    library_logger("py.warnings", "python.warning")
    return out


def configure_stderr(debug: bool) -> None:
    """Configure structlog once for an operator command's process, whose stdout holds its
    results (JSON, CSV, Arrow): events go to stderr as console lines, warnings and errors
    only. The libraries' own log lines (kazoo's "Connection dropped" on every retry,
    librdkafka's) are debug output: with `debug`, every event and library line is printed;
    without, none of the libraries'. The daemon's process calls `configure` instead."""
    level = logging.DEBUG if debug else logging.WARNING
    _configure_structlog(
        [structlog.processors.add_log_level, _STAMP, _console()],
        sys.stderr,
        level,
        cache=False,  # `main` may run again in this process (a test's), with another stderr
    )
    root = logging.getLogger()
    # A handler on the root keeps Python's last-resort stderr handler from printing them.
    root.addHandler(logging.StreamHandler(sys.stderr) if debug else logging.NullHandler())
    root.setLevel(level)


def _console() -> Any:
    """The renderer of console lines (`log_format = "console"`, operator commands)."""
    return structlog.dev.ConsoleRenderer(colors=False)


def _configure_structlog(
    processors: list[Any], out: IO[str] | LogSink, level: int, *, cache: bool
) -> None:
    """The one `structlog.configure` call: events below `level` are never built, the others
    go through `processors` (the last renders the line) to `out`; with `cache`, each logger
    binds its configuration on first use."""
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(file=out),  # type: ignore[arg-type]
        cache_logger_on_first_use=cache,
    )
