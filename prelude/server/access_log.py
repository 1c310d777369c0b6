"""The access log: one line per finished request, with what the engine did for it.

A plain ASGI wrapper times the request and captures its status; the endpoint adds the engine's
side (request id, execution class, tokens, queue time, TTFT) to the request's AccessEntry, found
in the ASGI scope. The line is built once, when a handler formats it: `str()` for text logs,
`fields()` for --log-format json. With --disable-log-requests (or a log level above info) the
wrapper is not installed at all, and endpoints find no entry: no per-request work.

Liveness, readiness and metrics probes (/health, /ping, /ready, /metrics) are not logged: at one
probe a second they would drown the requests."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import orjson
from starlette.requests import Request as HTTPRequest
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from prelude.engine.output import RequestOutput
from prelude.server.protocol import client_request_id

logger = logging.getLogger("prelude.access")

SCOPE_KEY = "prelude.access"
QUIET_PATHS = frozenset({"/health", "/ping", "/ready", "/metrics"})


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 2)


@dataclass(slots=True)
class AccessEntry:
    method: str
    route: str
    started: float  # perf_counter
    status: int = 0
    request_id: str | None = None
    execution_class: str | None = None  # OneShot | Decode | Mixed (see RequestMetrics); Mixed if rows differ
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    queue_s: float | None = None  # the longest a row waited to be scheduled
    ttft_s: float | None = None  # the first row's first output
    total_s: float = 0.0
    error: str | None = None

    def record(self, request_id: str, rows: Iterable[tuple[int, RequestOutput]], choices_per_prompt: int = 1) -> None:
        """The engine's side of the request: tokens summed over its rows (row index, output;
        rows are prompt-major), the longest queue wait, the earliest first output. A prompt's
        tokens count once however many choices (n) it has, as usage counts them: counted per
        row, n=4 logged four times the prompt tokens the response's usage reported."""
        self.request_id = request_id
        classes = set()
        for index, out in rows:
            if index % choices_per_prompt == 0:
                self.prompt_tokens += out.num_prompt_tokens
                self.cached_tokens += out.num_cached_tokens
            self.completion_tokens += out.num_output_tokens
            metrics = out.metrics
            if metrics is None:
                continue
            classes.add(metrics.execution_class)
            if self.queue_s is None or metrics.queue_s > self.queue_s:
                self.queue_s = metrics.queue_s
            if metrics.ttft_s is not None and (self.ttft_s is None or metrics.ttft_s < self.ttft_s):
                self.ttft_s = metrics.ttft_s
        if classes:
            self.execution_class = classes.pop() if len(classes) == 1 else "Mixed"

    def fields(self) -> dict:
        """The JSON line's keys (--log-format json)."""
        return {"event": "request", "request_id": self.request_id, "method": self.method, "route": self.route,
                "status": self.status, "class": self.execution_class, "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens, "cached_tokens": self.cached_tokens,
                "queue_ms": _ms(self.queue_s), "ttft_ms": _ms(self.ttft_s), "total_ms": _ms(self.total_s),
                "error": self.error}

    def __str__(self) -> str:
        line = (f"{self.request_id or '-'} {self.method} {self.route} {self.status} {self.execution_class or '-'} "
                f"prompt={self.prompt_tokens} completion={self.completion_tokens} cached={self.cached_tokens} "
                f"queue={_text_ms(self.queue_s)} ttft={_text_ms(self.ttft_s)} total={_text_ms(self.total_s)}")
        return line if self.error is None else f"{line} error={orjson.dumps(self.error).decode()}"


def _text_ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f}ms"


def entry(http: HTTPRequest) -> AccessEntry | None:
    """This request's entry, or None when requests are not logged."""
    return http.scope.get(SCOPE_KEY)


class AccessLog:
    """Times each request, captures its status (and an error's message), and logs its entry
    when the response is done: with `write` when given (a faster `logger.info` that the process's
    log setup provides, app.logs.batched_writer), else with `logger.info`."""

    def __init__(self, app: ASGIApp, write: Callable[[Any], None] | None = None):
        self.app = app
        self.write = write or logger.info

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in QUIET_PATHS:
            await self.app(scope, receive, send)
            return
        current = AccessEntry(scope["method"], scope["path"], time.perf_counter())
        scope[SCOPE_KEY] = current
        error_body: list[bytes] = []

        async def send_and_note(message: Message) -> None:
            if message["type"] == "http.response.start":
                current.status = message["status"]
            else:
                if current.status >= 400:  # error bodies are small and sent whole
                    error_body.append(message.get("body", b""))
                if not message.get("more_body", False):
                    # The response is complete: hypercorn writes its last bytes within this send,
                    # then may wait for the connection to close (a refusal that left its body
                    # unread, Connection: close), and that wait, long under a herd of
                    # connections, is no part of answering.
                    current.total_s = time.perf_counter() - current.started
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        finally:
            if not current.total_s:  # no complete response: the time the app took
                current.total_s = time.perf_counter() - current.started
            if current.request_id is None:  # refused before it had an id: the client's, to find it by
                current.request_id = client_request_id(scope)
            if current.status == 0:  # nothing was sent: the app raised past every handler
                current.status, current.error = 500, "no response"
            elif error_body and current.error is None:  # a 499's "client went away" stays
                current.error = _error_message(b"".join(error_body))
            self.write(current)


def _error_message(body: bytes) -> str:
    """The message of an OpenAI-style error body, else the body's start."""
    try:
        return str(orjson.loads(body)["error"]["message"])
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return body[:200].decode("utf-8", "replace")
