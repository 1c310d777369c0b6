"""Process-wide logging setup for `python -m prelude`: one line per record on stderr, as text or
as JSON objects (--log-format json) that log shippers parse without a grok pattern."""
from __future__ import annotations

import logging
import sys
import threading
import time
from typing import Any, Callable

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

    def stamp(self, created: float, separator: str) -> str:
        """The second's text, then `separator` and the milliseconds."""
        return f"{self(created)}{separator}{int((created - int(created)) * 1000):03d}"


class TextFormatter(logging.Formatter):
    """TEXT_FORMAT, with logging's default time format (year-month-day hours:minutes:seconds,ms)."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)
        self._second = _LocalSecond(self.default_time_format)

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return f"{self._second(record.created)},{int(record.msecs):03d}"

    def line(self, created: float, level: str, name: str, message: Any) -> str:
        """What format() makes of a record with these fields and no exception."""
        return f"{self._second.stamp(created, ',')} {level} {name}: {message}"


class JsonFormatter(logging.Formatter):
    """{"time", "level", "logger", "message"} per record; a record whose message object has
    `fields()` (an access-log entry) contributes those keys as well, so each field is a JSON
    key rather than text to re-parse."""

    def __init__(self) -> None:
        super().__init__()
        self._second = _LocalSecond("%Y-%m-%dT%H:%M:%S")

    def format(self, record: logging.LogRecord) -> str:
        out = self._head(record.created, record.levelname, record.name)
        fields = None if record.args else getattr(record.msg, "fields", None)
        if fields is not None:
            out.update(fields())
        else:
            out["message"] = record.getMessage()
        if record.exc_info:
            out["traceback"] = self.formatException(record.exc_info)
        return orjson.dumps(out).decode()

    def line(self, created: float, level: str, name: str, message: Any) -> str:
        """What format() makes of a record with these fields, no arguments and no exception."""
        out = self._head(created, level, name)
        fields = getattr(message, "fields", None)
        if fields is not None:
            out.update(fields())
        else:
            out["message"] = str(message)
        return orjson.dumps(out).decode()

    def _head(self, created: float, level: str, name: str) -> dict[str, Any]:
        return {"time": self._second.stamp(created, "."), "level": level, "logger": name}


ACCESS_FLUSH_S = 0.05  # the longest an access-log line waits in the buffer


class StderrHandler(logging.StreamHandler):
    """stderr through a buffer of its own. A record reaches the descriptor at once, except those
    of logger `batched` (the access log's, one line per request), which go out together, at
    most ACCESS_FLUSH_S after they were logged, or with the next other record, in order: a write
    system call per request cost the server more CPU than the rest of its line."""

    def __init__(self, batched: str) -> None:
        stream = open(sys.stderr.fileno(), "w", buffering=1 << 16, encoding=sys.stderr.encoding,
                      errors=sys.stderr.errors, closefd=False)
        super().__init__(stream)
        self.batched = batched
        self._due = threading.Event()  # access lines wait in the buffer
        threading.Thread(target=self._flush_when_due, name="prelude-log-flush", daemon=True).start()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._write(self.format(record), batched=record.name == self.batched)
        except RecursionError:
            raise
        except Exception:  # noqa: BLE001 (logging's own policy: report it, go on)
            self.handleError(record)

    def write_batched(self, message: Any) -> None:
        """Logs `message` at info as logger `batched` would through this handler, without making
        a LogRecord and passing it down logging's chain of calls: the access log's line per
        request cost three times as much that way (bench.serving.instructions)."""
        line = self.formatter.line(time.time(), "INFO", self.batched, message)  # type: ignore[union-attr]
        with self.lock:  # type: ignore[union-attr]  # created by Handler.__init__
            try:
                self._write(line, batched=True)
            except Exception:  # noqa: BLE001 (as emit: report it, go on)
                self.handleError(logging.makeLogRecord({"name": self.batched, "msg": message}))

    def _write(self, line: str, batched: bool) -> None:
        """A line into the buffer: out at once, or (batched) by the flushing thread soon."""
        self.stream.write(line + self.terminator)
        if not batched:
            self.stream.flush()
        elif not self._due.is_set():
            self._due.set()

    def _flush_when_due(self) -> None:
        while True:
            self._due.wait()
            time.sleep(ACCESS_FLUSH_S)
            self._due.clear()  # before the flush: a line logged during it sets it again
            self.flush()


def batched_writer() -> Callable[[Any], None] | None:
    """A faster `logger.info` for the logger whose records configure() set its StderrHandler to
    batch (the access log's): that handler's write_batched, while nothing else would see the
    record (no handler or filter of the logger's own, none on the root but that handler); else
    None."""
    root = logging.getLogger()
    handler = root.handlers[0] if len(root.handlers) == 1 else None
    if not isinstance(handler, StderrHandler) or handler.filters or root.filters \
            or not isinstance(handler.formatter, (TextFormatter, JsonFormatter)) or handler.level > logging.INFO:
        return None
    logger = logging.getLogger(handler.batched)
    if not logger.isEnabledFor(logging.INFO):
        return None
    node: logging.Logger | None = logger
    while node is not None and node is not root:
        if node.handlers or node.filters or not node.propagate:
            return None
        node = node.parent
    return handler.write_batched


def configure(level: str, log_format: str) -> None:
    # Neither format shows where a record was logged from, or its thread or process: the logging
    # HOWTO's "Optimization" switches spare each record (one access-log line per request) a walk
    # up the stack and the lookups of those fields.
    logging._srcfile = None
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    logging.logAsyncioTasks = False  # type: ignore[attr-defined]  # Python 3.12+
    from prelude.server.access_log import logger as access_logger  # after main() paused the collector

    handler = StderrHandler(batched=access_logger.name)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
