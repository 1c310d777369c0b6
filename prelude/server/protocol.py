"""Reading and validating request bodies. One pass over the JSON with typed accessors that raise
a 400 naming the offending field; no schema library on the hot path."""
from __future__ import annotations

import json
import math
from typing import Any

from starlette.requests import Request as HTTPRequest

from prelude.server.errors import APIError, bad_request

_MISSING = object()


async def read_json(http: HTTPRequest, limit: int) -> "Body":
    length = http.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise APIError(413, f"request body of {length} bytes exceeds the limit of {limit} bytes",
                       code="request_too_large")
    chunks, size = [], 0
    async for chunk in http.stream():
        size += len(chunk)
        if size > limit:
            raise APIError(413, f"request body exceeds the limit of {limit} bytes", code="request_too_large")
        chunks.append(chunk)
    raw = b"".join(chunks)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise bad_request(f"request body is not valid UTF-8: {exc.reason} at byte {exc.start}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise bad_request(f"request body is not valid JSON: {exc.msg} (line {exc.lineno} column {exc.colno})") from None
    if not isinstance(data, dict):
        raise bad_request("request body must be a JSON object")
    return Body(data)


def _type_name(value: Any) -> str:
    return {bool: "boolean", int: "integer", float: "number", str: "string", list: "array",
            dict: "object", type(None): "null"}.get(type(value), type(value).__name__)


class Body:
    """Typed, validating access to a JSON object. `null` counts as absent, as in OpenAI's API."""

    def __init__(self, data: dict, prefix: str = ""):
        self.data = data
        self.prefix = prefix

    def _raw(self, name: str):
        value = self.data.get(name, _MISSING)
        return _MISSING if value is None else value

    def has(self, name: str) -> bool:
        return self._raw(name) is not _MISSING

    def param(self, name: str) -> str:
        return self.prefix + name

    def invalid(self, name: str, problem: str) -> APIError:
        """A 400 naming the field (with its path inside nested objects)."""
        return bad_request(f"'{self.param(name)}' {problem}", self.param(name))

    def _wrong_type(self, name: str, expected: str, value) -> APIError:
        return self.invalid(name, f"must be {expected}, got {_type_name(value)}")

    def require(self, name: str):
        value = self._raw(name)
        if value is _MISSING:
            raise self.invalid(name, "is required")
        return value

    def int(self, name: str, default=None, lo: int | None = None, hi: int | None = None):
        value = self._raw(name)
        if value is _MISSING:
            return default
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if not isinstance(value, int) or isinstance(value, bool):
            raise self._wrong_type(name, "an integer", value)
        self._check_range(name, value, lo, hi)
        return value

    def float(self, name: str, default=None, lo: float | None = None, hi: float | None = None):
        value = self._raw(name)
        if value is _MISSING:
            return default
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
            raise self._wrong_type(name, "a number", value)
        self._check_range(name, value, lo, hi)
        return float(value)

    def _of_type(self, name: str, default, kind: type, expected: str):
        value = self._raw(name)
        if value is _MISSING:
            return default
        if not isinstance(value, kind):
            raise self._wrong_type(name, expected, value)
        return value

    def bool(self, name: str, default: bool = False) -> bool:
        return self._of_type(name, default, bool, "a boolean")

    def str(self, name: str, default=None):
        return self._of_type(name, default, str, "a string")

    def list(self, name: str, default=None, nonempty: bool = False):
        value = self._of_type(name, default, list, "an array")
        if nonempty and value is not default and not value:
            raise self.invalid(name, "must not be empty")
        return value

    def object(self, name: str) -> "Body | None":
        value = self._of_type(name, None, dict, "an object")
        return None if value is None else Body(value, prefix=f"{self.param(name)}.")

    def str_list(self, name: str, max_items: int | None = None) -> tuple[str, ...]:
        """A string or an array of strings (OpenAI's `stop`)."""
        value = self._raw(name)
        if value is _MISSING:
            return ()
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
            raise self.invalid(name, "must be a string or an array of strings")
        if max_items is not None and len(items) > max_items:
            raise self.invalid(name, f"accepts at most {max_items} items")
        return tuple(items)

    def int_list(self, name: str, lo: int = 0, hi: int | None = None) -> tuple[int, ...] | None:
        value = self.list(name)
        if value is None:
            return None
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise self.invalid(name, "must be an array of integers")
        for v in value:
            self._check_range(name, v, lo, hi)
        return tuple(value)

    def _check_range(self, name: str, value, lo, hi) -> None:
        if lo is not None and value < lo:
            raise self.invalid(name, f"must be >= {lo}, got {value}")
        if hi is not None and value > hi:
            raise self.invalid(name, f"must be <= {hi}, got {value}")
