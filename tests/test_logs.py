"""The log formats: a text line is logging's own default layout, whatever second it falls in."""
from __future__ import annotations

import logging

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
