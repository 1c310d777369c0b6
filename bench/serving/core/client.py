"""Sending one benchmark request and timing it: non-streaming (one JSON answer) or streaming
(server-sent events, where the first chunk carrying a choice marks the first token)."""
from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import time
from typing import Any, AsyncIterator

import httpx

from bench.serving.core.stats import RequestRecord
from bench.serving.core.workloads import Job

JSON_HEADERS = {"content-type": "application/json"}
DONE = object()  # the SSE stream's "[DONE]" sentinel
DRAIN_TIMEOUT_S = 1.0  # the longest a stream's client waits for the body's end after [DONE]


def make_client(base_url: str, connections: int, timeout: float, api_key: str | None = None,
                verify: ssl.SSLContext | bool = True) -> httpx.AsyncClient:
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    # Idle connections are dropped after 4 s: servers on uvicorn (vLLM, SGLang) close them at 5 s,
    # and a request sent just as a server closes its connection fails before reaching it.
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections, keepalive_expiry=4.0)
    return httpx.AsyncClient(base_url=base_url, limits=limits, headers=headers, verify=verify,
                             timeout=httpx.Timeout(timeout, connect=min(timeout, 30.0)))


class ClientPool:
    """HTTP/1.1 keep-alive connections, one per request in flight, at most `size`: a request
    never waits inside the client for a connection (that wait would count as server latency).

    Each connection is its own single-connection httpx.AsyncClient. One client with `size`
    connections would be simpler, but httpcore's pool checks every connection (with a socket
    poll each) on every request: at 64 connections that tripled the client's CPU per request,
    and on a small machine the client's CPU is the server's too."""

    def __init__(self, base_url: str, size: int, timeout: float, api_key: str | None = None):
        self.base_url, self.timeout, self.api_key = base_url, timeout, api_key
        self._ssl = ssl.create_default_context()  # shared: each client would load the CA bundle
        self._idle: list[httpx.AsyncClient] = []
        self._clients: list[httpx.AsyncClient] = []
        self._slots = asyncio.Semaphore(size)
        self.size = size

    async def send(self, job: Job) -> RequestRecord:
        async with self._slots:
            client = self._take()
            try:
                return await send(client, job)
            finally:
                self._idle.append(client)

    async def open_connections(self, n: int) -> None:
        """Opens n connections now (GET /health on each), so measured requests never connect."""
        async def touch() -> None:
            async with self._slots:
                client = self._take()
                try:
                    await client.get("/health")
                except httpx.HTTPError:
                    pass
                finally:
                    self._idle.append(client)

        await asyncio.gather(*(touch() for _ in range(min(n, self.size))))

    def _take(self) -> httpx.AsyncClient:
        if self._idle:
            return self._idle.pop()  # most recently used first: its connection is warm
        client = make_client(self.base_url, 1, self.timeout, self.api_key, self._ssl)
        self._clients.append(client)
        return client

    async def aclose(self) -> None:
        await asyncio.gather(*(c.aclose() for c in self._clients))

    async def __aenter__(self) -> "ClientPool":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()


async def _drain(lines: AsyncIterator[str]) -> None:
    async for _ in lines:
        pass


def parse_sse_line(line: str) -> Any:
    """A `data:` line's JSON payload, DONE for `[DONE]`, None for anything else (comments,
    blank separators, event names)."""
    if not line.startswith("data:"):
        return None
    payload = line[5:].strip()
    if payload == "[DONE]":
        return DONE
    return json.loads(payload) if payload else None


def error_message(status: int, text: str) -> str:
    """A short message from an error response: OpenAI's {"error": {"message"}}, vLLM's
    {"message"}, or the raw text."""
    message = text
    try:
        data = json.loads(text)
        if isinstance(data, dict):
            error = data.get("error")
            if isinstance(error, dict):
                message = str(error.get("message", text))
            elif isinstance(data.get("message"), str):
                message = data["message"]
            elif isinstance(data.get("detail"), str):
                message = data["detail"]
    except ValueError:
        pass
    return f"HTTP {status}: {message.strip()[:200]}"


def _usage(data: dict, record: RequestRecord) -> bool:
    usage = data.get("usage")
    if not isinstance(usage, dict):
        return False
    if isinstance(usage.get("prompt_tokens"), int):
        record.prompt_tokens = usage["prompt_tokens"]
    if isinstance(usage.get("completion_tokens"), int):
        record.output_tokens = usage["completion_tokens"]
    return True


async def send(client: httpx.AsyncClient, job: Job) -> RequestRecord:
    record = RequestRecord(start=time.perf_counter(), prompt_tokens=job.prompt_tokens,
                           expected_output_tokens=job.output_tokens)
    try:
        if job.stream:
            await _streamed(client, job, record)
        else:
            await _unstreamed(client, job, record)
    except (httpx.HTTPError, ValueError) as exc:  # ValueError: a malformed JSON answer
        record.ok = False
        record.error = f"{type(exc).__name__}: {exc}"[:200]
    record.end = record.end or time.perf_counter()
    return record


async def _unstreamed(client: httpx.AsyncClient, job: Job, record: RequestRecord) -> None:
    resp = await client.post(job.path, content=job.body, headers=JSON_HEADERS)
    record.end = time.perf_counter()
    if resp.status_code != 200:
        record.error = error_message(resp.status_code, resp.text)
        return
    data = resp.json()
    if not isinstance(data, dict) or "error" in data:
        record.error = error_message(resp.status_code, resp.text)
        return
    _usage(data, record)
    if job.output_tokens and "usage" not in data:
        record.output_tokens = len(data.get("choices") or ())  # at least one token per choice
    record.ok = True


async def _streamed(client: httpx.AsyncClient, job: Job, record: RequestRecord) -> None:
    chunks_with_choices = 0
    has_usage = False
    done_at: float | None = None  # when [DONE] came
    async with client.stream("POST", job.path, content=job.body, headers=JSON_HEADERS) as resp:
        if resp.status_code != 200:
            await resp.aread()
            record.end = time.perf_counter()
            record.error = error_message(resp.status_code, resp.text)
            return
        lines = resp.aiter_lines()
        async for line in lines:
            data = parse_sse_line(line)
            if data is None:
                continue
            if data is DONE:
                done_at = time.perf_counter()
                break
            if "error" in data:
                record.end = time.perf_counter()
                record.error = error_message(200, json.dumps(data))
                return
            if data.get("choices"):
                if record.first_token is None:
                    record.first_token = time.perf_counter()
                chunks_with_choices += 1
            has_usage = _usage(data, record) or has_usage
        if done_at is not None:
            # The body's end is read too, as OpenAI's client reads it: a stream left unread
            # closes its connection, and the next request would connect. Bounded, for a server
            # that keeps the body open after [DONE].
            with contextlib.suppress(asyncio.TimeoutError, httpx.HTTPError):
                await asyncio.wait_for(_drain(lines), DRAIN_TIMEOUT_S)
    record.end = time.perf_counter() if done_at is None else done_at
    if not has_usage:
        record.output_tokens = chunks_with_choices  # servers that omit usage: one token a chunk
    record.ok = record.first_token is not None
    if not record.ok:
        record.error = "stream ended without a token"
