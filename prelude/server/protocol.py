"""Reading and validating request bodies. One pass over the JSON with typed accessors that raise
a 400 naming the offending field; no schema library on the hot path.

Everything a later layer could choke on is refused here: invalid UTF-8 and lone surrogates
(orjson rejects both), NaN and infinities, nesting deeper than MAX_JSON_DEPTH, and numbers
outside what the engine represents (integers beyond int64, non-finite floats)."""
from __future__ import annotations

import builtins
import math
import re
from typing import Any

import numpy as np
import orjson
from starlette.requests import ClientDisconnect, Request as HTTPRequest
from starlette.types import Scope

from prelude.server.errors import APIError, bad_request

_MISSING = object()

# Deepest JSON nesting accepted. Real requests nest a few levels (tool schemas a dozen); the
# limit keeps every later recursive walk (templates, json.dumps of tools) far from Python's
# recursion limit.
MAX_JSON_DEPTH = 64
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
_QUOTE, _BACKSLASH = ord('"'), ord("\\")
_BRACKETS = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}
_DEPTH_STEP = np.zeros(256, dtype=np.int8)
for _byte, _step in _BRACKETS.items():
    _DEPTH_STEP[_byte] = _step


def json_depth_exceeds(raw: bytes, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether valid JSON text nests deeper than `limit`. Almost every body has fewer brackets
    than the limit and is cleared by two counts; the rest are measured in whole-array passes,
    brackets inside strings (which may hold brackets) not counted. A regex blanking the strings
    out costs one match per string, seconds of the event loop on a large body of short strings.
    Only for text orjson has accepted: every string closes, and a quote inside one is escaped."""
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return False
    data = np.frombuffer(raw, dtype=np.uint8)
    quote = data == _QUOTE
    if b"\\" in raw:
        # A quote after an odd run of backslashes is escaped: it delimits nothing.
        after_backslash = np.flatnonzero(quote[1:] & (data[:-1] == _BACKSLASH)) + 1
        if len(after_backslash):
            plain = np.flatnonzero(data != _BACKSLASH)  # every quote is among them
            run = after_backslash - 1 - plain[np.searchsorted(plain, after_backslash) - 1]
            quote[after_backslash[run % 2 == 1]] = False
    inside = np.bitwise_xor.accumulate(quote.view(np.uint8)).view(bool)  # from an opening quote on
    step = np.where(inside, np.int8(0), _DEPTH_STEP[data])
    return int(np.cumsum(step, dtype=np.int32).max(initial=0)) > limit


def parse_json(raw: bytes) -> Any:
    """The JSON value of a body, or a 400 saying why it is not one. orjson parses in linear
    time and refuses nesting past 1024 levels itself; the tighter MAX_JSON_DEPTH is checked on
    what it accepted, before any of our code walks the value."""
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        if not raw.startswith(UTF8_BOM):
            raise bad_request(f"request body is not valid JSON: {exc}") from None
        # A file saved as "UTF-8 with BOM" (PowerShell's utf8) and posted with curl: Python's
        # json, which vLLM's server reads bodies with, skips the mark.
        return parse_json(raw[len(UTF8_BOM):])
    if json_depth_exceeds(raw):
        raise bad_request(f"request body nests JSON deeper than {MAX_JSON_DEPTH} levels")
    return value


UTF8_BOM = b"\xef\xbb\xbf"
_HEADERS = "prelude.headers"  # the scope's key for its headers as a dict
_CLIENT_ID = re.compile(rb"[!-~]{1,128}")  # visible ASCII, no spaces


def scope_header(scope: Scope, name: bytes) -> bytes | None:
    """The request's first `name` header (lowercase, as ASGI gives names), or None. A request
    is asked for several (its length, id, deadline, key): they come from a dict built once, in
    C, where a scan of the headers for each cost some 70 bytecodes. Starlette's `headers.get`
    builds a Headers object and raises and catches a KeyError for each header that is absent."""
    headers = scope.get(_HEADERS)
    if headers is None:
        headers = scope[_HEADERS] = dict(reversed(scope["headers"]))  # reversed: the first one wins
    return headers.get(name)


def header(http: HTTPRequest, name: bytes) -> str | None:
    """scope_header, as text."""
    value = scope_header(http.scope, name)
    return None if value is None else value.decode("latin-1")


def client_request_id(scope: Scope) -> str | None:
    """The client's X-Request-Id where it can name a response (vLLM builds its ids on it): visible
    ASCII without spaces, at most 128 bytes; else None."""
    value = scope_header(scope, b"x-request-id")
    return value.decode("ascii") if value is not None and _CLIENT_ID.fullmatch(value) else None


async def read_json(http: HTTPRequest, limit: int) -> "Body":
    """The request's body as a JSON object, read from the ASGI messages directly (most bodies
    are one message). 413 past `limit`, by the Content-Length before any byte is read, or once
    the bytes read pass it; ClientDisconnect if the client goes away first."""
    length = header(http, b"content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise APIError(413, f"request body of {length} bytes exceeds the limit of {limit} bytes",
                       code="request_too_large")
    chunks, size = [], 0
    while True:
        message = await http.receive()
        if message["type"] != "http.request":
            raise ClientDisconnect()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise APIError(413, f"request body exceeds the limit of {limit} bytes", code="request_too_large")
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    try:
        data = parse_json(chunks[0] if len(chunks) == 1 else b"".join(chunks))
    except APIError:
        encoding = header(http, b"content-encoding")
        if encoding is not None and encoding.strip().lower() != "identity":  # a gzip body read as "not UTF-8"
            raise APIError(415, f"Content-Encoding {encoding!r} is not supported: send the JSON body as is",
                           code="unsupported_media_type") from None
        raise
    if not isinstance(data, dict):
        raise bad_request("request body must be a JSON object")
    return Body(data)


def _type_name(value: Any) -> str:
    return {bool: "boolean", int: "integer", float: "number", str: "string", list: "array",
            dict: "object", type(None): "null"}.get(type(value), type(value).__name__)


class Body:
    """Typed, validating access to a JSON object. `null` counts as absent, as in OpenAI's API.
    The accessors are named after the JSON types, so annotations below them say `builtins.str`."""

    def __init__(self, data: dict, prefix: str = ""):
        self.data = data
        self.prefix = prefix
        self.asked: set[builtins.str] = set()  # the fields the endpoint looked for

    # Most fields a request could name it does not: each accessor looks its field up first and
    # returns the default at once, and only a field that is there counts as asked for.
    def _raw(self, name: str):
        value = self.data.get(name)
        if value is None:
            return _MISSING
        self.asked.add(name)
        return value

    def ignored(self) -> list[builtins.str]:
        """The fields the endpoint never looked for: unknown to it, so ignored (as vLLM does).
        A null field is absent, so never among them."""
        return [name for name, value in self.data.items() if value is not None and name not in self.asked]

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

    def int(self, name: str, default=None, lo: int = INT64_MIN, hi: int = INT64_MAX):
        """An integer within [lo, hi]; the default bounds are int64's, what the engine holds."""
        value = self.data.get(name)
        if value is None:
            return default
        self.asked.add(name)
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if not isinstance(value, int) or isinstance(value, bool):
            raise self._wrong_type(name, "an integer", value)
        self._check_range(name, value, lo, hi)
        return value

    def float(self, name: str, default=None, lo: float | None = None, hi: float | None = None):
        value = self.data.get(name)
        if value is None:
            return default
        self.asked.add(name)
        if isinstance(value, int) and not isinstance(value, bool) and not INT64_MIN <= value <= INT64_MAX:
            raise self.invalid(name, "is out of range")  # float() of a huge int overflows
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
            raise self._wrong_type(name, "a finite number", value)
        self._check_range(name, value, lo, hi)
        return float(value)

    def _of_type(self, name: str, value, kind: type, expected: str):
        """A field that is there (not null), checked to be of `kind`."""
        self.asked.add(name)
        if not isinstance(value, kind):
            raise self._wrong_type(name, expected, value)
        return value

    def bool(self, name: str, default: bool = False) -> bool:
        value = self.data.get(name)
        return default if value is None else self._of_type(name, value, bool, "a boolean")

    def str(self, name: str, default=None):
        value = self.data.get(name)
        return default if value is None else self._of_type(name, value, str, "a string")

    def list(self, name: builtins.str, default=None, nonempty: builtins.bool = False):
        value = self.data.get(name)
        if value is None:
            return default
        value = self._of_type(name, value, list, "an array")
        if nonempty and not value:
            raise self.invalid(name, "must not be empty")
        return value

    def object(self, name: builtins.str) -> "Body | None":
        value = self.data.get(name)
        if value is None:
            return None
        return Body(self._of_type(name, value, dict, "an object"), prefix=f"{self.param(name)}.")

    def str_list(self, name: builtins.str, max_items: builtins.int | None = None) -> tuple[builtins.str, ...]:
        """A string or an array of non-empty strings (OpenAI's `stop`; an empty one would match
        everywhere, and vLLM refuses it)."""
        value = self._raw(name)
        if value is _MISSING:
            return ()
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
            raise self.invalid(name, "must be a string or an array of strings")
        if not all(items):
            raise self.invalid(name, "must not contain an empty string")
        if max_items is not None and len(items) > max_items:
            raise self.invalid(name, f"accepts at most {max_items} items")
        return tuple(items)

    def int_list(self, name: builtins.str, lo: builtins.int = 0,
                 hi: builtins.int = INT64_MAX) -> tuple[builtins.int, ...] | None:
        value = self.list(name)
        if value is None:
            return None
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise self.invalid(name, "must be an array of integers")
        for v in value:
            self._check_range(name, v, lo, hi)
        return tuple(value)

    def _check_range(self, name: builtins.str, value, lo, hi) -> None:
        if lo is not None and value < lo:
            raise self.invalid(name, f"must be >= {lo}, got {_shown(value)}")
        if hi is not None and value > hi:
            raise self.invalid(name, f"must be <= {hi}, got {_shown(value)}")


def _shown(value) -> builtins.str:
    """A number as an error message quotes it: 1e308 sent for an integer field is a 309-digit
    int once it passes the integer check, and was printed whole."""
    text = builtins.str(value)
    return text if len(text) <= 24 else f"{float(value):.6g}"
