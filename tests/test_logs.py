"""The log formats: a text line is logging's own default layout, whatever second it falls in."""
from __future__ import annotations

import logging
import time

from prelude.app.logs import TEXT_FORMAT, JsonFormatter, TextFormatter


def _record(created: float) -> logging.LogRecord:
    record = logging.LogRecord("prelude.access", logging.INFO, "", 0, "a line", (), None)
    record.created, record.msecs = created, (created - int(created)) * 1000
    return record


def test_text_lines_match_loggings_default_format_across_seconds():
    ours, reference = TextFormatter(), logging.Formatter(TEXT_FORMAT)
    for created in (1_790_000_000.001, 1_790_000_000.999, 1_790_000_001.5, 1_790_000_000.25, 1_790_086_400.0):
        record = _record(created)
        assert ours.format(record) == reference.format(record)


def test_json_time_follows_the_record_across_seconds():
    formatter = JsonFormatter()
    first, second = formatter.format(_record(1_790_000_000.999)), formatter.format(_record(1_790_000_001.002))
    assert '.999"' in first and '.002"' in second
    assert first.split('"time":"')[1][:19] != second.split('"time":"')[1][:19]


def test_access_lines_reach_stderr_batched_and_in_order(capfd):
    """An access-log line waits in the buffer at most a moment, and any other record takes the
    waiting lines out with it, before itself."""
    from prelude.app.logs import ACCESS_FLUSH_S, StderrHandler
    from prelude.server.access_log import logger as access_logger

    handler = StderrHandler(batched=access_logger.name)
    handler.setFormatter(TextFormatter())

    def record(name: str, level: int, text: str) -> logging.LogRecord:
        return logging.LogRecord(name, level, "", 0, text, (), None)

    handler.handle(record(access_logger.name, logging.INFO, "first request"))
    handler.handle(record("prelude.engine", logging.WARNING, "a warning"))
    err = capfd.readouterr().err
    assert err.index("first request") < err.index("a warning")
    handler.handle(record(access_logger.name, logging.INFO, "second request"))
    deadline = time.monotonic() + 100 * ACCESS_FLUSH_S
    seen = ""
    while "second request" not in seen and time.monotonic() < deadline:
        time.sleep(ACCESS_FLUSH_S / 5)
        seen += capfd.readouterr().err
    assert "second request" in seen


def test_a_line_written_directly_is_the_line_its_record_formats_to():
    from prelude.server.access_log import AccessEntry

    entry = AccessEntry("POST", "/v1/completions", 0.0, 200, "cmpl-1", "OneShot", 128, 1, 0, 0.0001, 0.002, 0.003)
    for formatter in (TextFormatter(), JsonFormatter()):
        for created in (1_790_000_000.001, 1_790_000_000.999, 1_790_000_001.5):
            for message in (entry, "a plain line"):
                record = logging.LogRecord("prelude.access", logging.INFO, "", 0, message, (), None)
                record.created, record.msecs = created, (created - int(created)) * 1000
                assert formatter.line(created, "INFO", "prelude.access", message) == formatter.format(record)


def test_the_access_log_writes_directly_only_where_nothing_else_would_see_its_records():
    from prelude.app.logs import StderrHandler, batched_writer, configure
    from prelude.server.access_log import logger as access_logger

    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        configure("info", "text")
        handler = root.handlers[0]
        assert isinstance(handler, StderrHandler)
        assert batched_writer() == handler.write_batched
        access_logger.addFilter(lambda record: True)
        assert batched_writer() is None  # a filter must see every record
        access_logger.filters.clear()
        root.addHandler(logging.NullHandler())
        assert batched_writer() is None  # so must a second handler
        root.handlers[:] = [handler]
        root.setLevel(logging.WARNING)
        assert batched_writer() is None  # and info is not logged at all
    finally:
        root.handlers[:], root.level = saved[0], saved[1]
        access_logger.filters.clear()
