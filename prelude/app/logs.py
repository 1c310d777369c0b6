"""Process-wide logging setup for `python -m prelude`: one line per record on stderr, as text or
as JSON objects (--log-format json) that log shippers parse without a grok pattern."""
from __future__ import annotations

import logging
import time

import orjson

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class _LocalSecond:
    """The local time of a record's second as `fmt` formats it, formatted once per second: the
    access log writes a line per request, each of which paid localtime and strftime for the
    second the line before it had formatted already."""

    def __init__(self, fmt: str):
        self.fmt = fmt
        self.second = -1
        self.text = ""

    def __call__(self, created: float) -> str:
        second = int(created)
        if second != self.second:
            self.text, self.second = time.strftime(self.fmt, time.localtime(second)), second
        return self.text


class TextFormatter(logging.Formatter):
    """TEXT_FORMAT, with logging's default time format (2026-11-29 18:20:36,589)."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)
        self._second = _LocalSecond(self.default_time_format)

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return f"{self._second(record.created)},{int(record.msecs):03d}"


class JsonFormatter(logging.Formatter):
    """{"time", "level", "logger", "message"} per record; a record whose message object has
    `fields()` (an access-log entry) contributes those keys as well, so each field is a JSON
    key rather than text to re-parse."""

    def __init__(self) -> None:
        super().__init__()
        self._second = _LocalSecond("%Y-%m-%dT%H:%M:%S")

    def format(self, record: logging.LogRecord) -> str:
        out = {"time": f"{self._second(record.created)}.{int(record.msecs):03d}", "level": record.levelname,
               "logger": record.name}
        fields = getattr(record.msg, "fields", None)
        if fields is not None and not record.args:
            out.update(fields())
        else:
            out["message"] = record.getMessage()
        if record.exc_info:
            out["traceback"] = self.formatException(record.exc_info)
        return orjson.dumps(out).decode()


def configure(level: str, log_format: str) -> None:
    # Neither format shows where a record was logged from, or its thread or process: the logging
    # HOWTO's "Optimization" switches spare each record (one access-log line per request) a walk
    # up the stack and the lookups of those fields.
    logging._srcfile = None
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    logging.logAsyncioTasks = False  # type: ignore[attr-defined]  # Python 3.12+
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
