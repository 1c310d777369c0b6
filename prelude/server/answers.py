"""What every endpoint's answer is made of: response ids, JSON responses, the usage of requests
that generate nothing, and the check on a list input's length."""
from __future__ import annotations

import itertools
import os
from typing import Any

from starlette.requests import Request as HTTPRequest
from starlette.responses import Response

from prelude.server.errors import bad_request
from prelude.server.protocol import client_request_id
from prelude.server.streaming import dumps

_ids = itertools.count()
_ID_PREFIX = os.urandom(4).hex()


def new_id(kind: str, http: HTTPRequest | None = None) -> str:
    """A response id: built on the client's X-Request-Id when it sent a usable one (as vLLM
    does), else unique to this server."""
    client = client_request_id(http.scope) if http is not None else None
    if client is not None:
        return f"{kind}-{client}"
    return f"{kind}-{_ID_PREFIX}{next(_ids):08x}"


class JSONResponse(Response):
    """A JSON answer with the headers Starlette's Response gives it, set at once: its render and
    init_headers steps cost some 90 bytecodes an answer to reach the same two."""

    media_type = "application/json"

    def __init__(self, body: bytes, status_code: int = 200):
        self.status_code, self.body, self.background = status_code, body, None
        self.raw_headers = [(b"content-length", b"%d" % len(body)), (b"content-type", b"application/json")]


def json_response(obj: Any, status: int = 200) -> Response:
    return JSONResponse(dumps(obj), status)


def check_count(name: str, count: int, limit: int | None) -> None:
    """Refuses a list input longer than the per-request limit."""
    if limit is not None and count > limit:
        raise bad_request(f"'{name}' has {count} entries; at most {limit} are allowed", name)


def prompt_usage(prompts: list[list[int]]) -> dict:
    """Usage of requests that generate nothing: every token is a prompt token."""
    tokens = sum(map(len, prompts))
    return {"prompt_tokens": tokens, "total_tokens": tokens}
