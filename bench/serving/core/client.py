"""Sending one benchmark request and timing it: non-streaming (one JSON answer) or streaming
(server-sent events, where the first chunk carrying a choice marks the first token).

The timed requests go through aiohttp. httpx, which the benchmarks used before, spent 0.8-1.1 ms
of CPU on a one-token request and added 0.3-0.5 ms to its latency at c=1, where aiohttp spends
0.2 ms and answers as fast as a bare http.client loop (`bench/serving/results/
cpu-amd-zen4-2026-12-07-client/`): every latency the benchmarks reported carried it, and on a
two-core machine the client's CPU was the server's. httpx stays for the untimed calls
(`make_client`: the model's name, /tokenize)."""
from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any

import aiohttp
import httpx

from bench.serving.core.stats import RequestRecord
from bench.serving.core.workloads import Job

JSON_HEADERS = {"content-type": "application/json"}
DONE = object()  # the SSE stream's "[DONE]" sentinel
DRAIN_TIMEOUT_S = 1.0  # the longest a stream's client waits for the body's end after [DONE]
CONNECT_TIMEOUT_S = 30.0
KEEPALIVE_S = 4.0  # servers on uvicorn (vLLM, SGLang) close idle connections at 5 s
READ_BUFFER = 1 << 20  # a server-sent line may be as long as this (a chunk with many logprobs)
TRANSPORT_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError)


def make_client(base_url: str, connections: int, timeout: float, api_key: str | None = None) -> httpx.AsyncClient:
    """A client for the untimed calls around a run."""
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    # Idle connections are dropped before a uvicorn server would close them: a request sent
    # just as a server closes its connection fails before reaching it.
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections,
                          keepalive_expiry=KEEPALIVE_S)
    return httpx.AsyncClient(base_url=base_url, limits=limits, headers=headers,
                             timeout=httpx.Timeout(timeout, connect=min(timeout, CONNECT_TIMEOUT_S)))


def open_session(connections: int, timeout: float, api_key: str | None = None) -> aiohttp.ClientSession:
    """A session for timed requests, made inside the running event loop: at most `connections`
    keep-alive connections, `timeout` the longest wait for any one read of an answer."""
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=connections, keepalive_timeout=KEEPALIVE_S),
        headers=headers, read_bufsize=READ_BUFFER,
        timeout=aiohttp.ClientTimeout(total=None, connect=min(timeout, CONNECT_TIMEOUT_S), sock_read=timeout))


class ClientPool:
    """HTTP/1.1 keep-alive connections, one per request in flight, at most `size`: a request
    never waits inside the client for a connection (that wait would count as server latency).
    The most recently used idle connection is taken first (aiohttp's pool): its state is warm.
    `timeout`: the longest wait for any one read of an answer."""

    def __init__(self, base_url: str, size: int, timeout: float, api_key: str | None = None):
        self.base_url, self.timeout, self.api_key = base_url.rstrip("/"), timeout, api_key
        self._slots = asyncio.Semaphore(size)
        self._session: aiohttp.ClientSession | None = None
        self.size = size

    async def send(self, job: Job) -> RequestRecord:
        async with self._slots:
            return await send(self._open(), self.base_url + job.path, job)

    async def open_connections(self, n: int) -> None:
        """Opens n connections now (GET /health on each), so measured requests never connect."""
        session = self._open()

        async def touch() -> None:
            async with self._slots:
                with contextlib.suppress(*TRANSPORT_ERRORS):
                    async with session.get(self.base_url + "/health") as resp:
                        await resp.read()

        await asyncio.gather(*(touch() for _ in range(min(n, self.size))))

    def _open(self) -> aiohttp.ClientSession:
        """The session, made on first use: aiohttp binds it to the running event loop."""
        if self._session is None:
            self._session = open_session(self.size, self.timeout, self.api_key)
        return self._session

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def __aenter__(self) -> "ClientPool":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()


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


async def send(session: aiohttp.ClientSession, url: str, job: Job) -> RequestRecord:
    record = RequestRecord(start=time.perf_counter(), prompt_tokens=job.prompt_tokens,
                           expected_output_tokens=job.output_tokens)
    try:
        if job.stream:
            await _streamed(session, url, job, record)
        else:
            await _unstreamed(session, url, job, record)
    except (*TRANSPORT_ERRORS, ValueError) as exc:  # ValueError: a malformed JSON answer
        record.ok = False
        record.error = f"{type(exc).__name__}: {exc}"[:200]
    record.end = record.end or time.perf_counter()
    return record


async def _unstreamed(session: aiohttp.ClientSession, url: str, job: Job, record: RequestRecord) -> None:
    async with session.post(url, data=job.body, headers=JSON_HEADERS) as resp:
        body = await resp.read()
    record.end = time.perf_counter()
    if resp.status != 200:
        record.error = error_message(resp.status, body.decode("utf-8", "replace"))
        return
    data = json.loads(body)
    if not isinstance(data, dict) or "error" in data:
        record.error = error_message(resp.status, body.decode("utf-8", "replace"))
        return
    _usage(data, record)
    if job.output_tokens and "usage" not in data:
        record.output_tokens = len(data.get("choices") or ())  # at least one token per choice
    record.ok = True


async def _streamed(session: aiohttp.ClientSession, url: str, job: Job, record: RequestRecord) -> None:
    chunks_with_choices = 0
    has_usage = False
    done_at: float | None = None  # when [DONE] came
    async with session.post(url, data=job.body, headers=JSON_HEADERS) as resp:
        if resp.status != 200:
            body = await resp.read()
            record.end = time.perf_counter()
            record.error = error_message(resp.status, body.decode("utf-8", "replace"))
            return
        async for line in resp.content:
            data = parse_sse_line(line.decode("utf-8", "replace"))
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
            with contextlib.suppress(*TRANSPORT_ERRORS):
                await asyncio.wait_for(resp.content.read(), DRAIN_TIMEOUT_S)
    record.end = time.perf_counter() if done_at is None else done_at
    if not has_usage:
        record.output_tokens = chunks_with_choices  # servers that omit usage: one token a chunk
    record.ok = record.first_token is not None
    if not record.ok:
        record.error = "stream ended without a token"
