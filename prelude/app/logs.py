"""Process-wide logging setup for `python -m prelude`: one line per record on stderr, as text or
as JSON objects (--log-format json) that log shippers parse without a grok pattern."""
from __future__ import annotations

import logging
import time

import orjson

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """{"time", "level", "logger", "message"} per record; a record whose message object has
    `fields()` (an access-log entry) contributes those keys as well, so each field is a JSON
    key rather than text to re-parse."""

    def format(self, record: logging.LogRecord) -> str:
        out = {"time": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(record.created))
               + f".{int(record.msecs):03d}", "level": record.levelname, "logger": record.name}
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
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
