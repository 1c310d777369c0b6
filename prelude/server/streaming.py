"""Server-sent events, and client-disconnect handling for long requests."""
from __future__ import annotations

import asyncio
from typing import AsyncGenerator, AsyncIterator, Callable

import orjson
from starlette.types import Receive, Scope, Send

from prelude.engine.output import (
    ConstraintFailed,
    DeadlineExceeded,
    EngineError,
    RequestOutput,
    RequestStream,
    ShutDown,
)
from prelude.server.errors import APIError


def dumps(obj) -> bytes:
    """Compact UTF-8 JSON (orjson: several times faster than the standard library here)."""
    return orjson.dumps(obj)


def sse(obj) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"


async def wait_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


class EventStream:
    """An SSE response that stops producing as soon as the client goes away: the producer is
    cancelled, so its `finally` (which aborts the engine request and frees its blocks) runs
    right then, not at the next failed write. The event that ends in [DONE] is the stream's
    last and carries the response's end: one write, so a client that reads the body to its end
    after [DONE] (as OpenAI's does, to keep the connection) has it in the same packet.

    The events are pumped in the response's own task, and one task watches for the client
    going away, which cancels the pump: a pump task of its own, an asyncio.wait and a gather
    over both cost a streamed request some 800 bytecodes of its event loop."""

    def __init__(self, events: AsyncGenerator[bytes, None], on_close: Callable[[], None]):
        self.events = events
        self.on_close = on_close  # aborts what the events came from, whatever ended the response

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-cache"),
            (b"x-accel-buffering", b"no"),
        ]})
        pumping = asyncio.current_task()
        assert pumping is not None
        ending, gone = False, False

        async def watch() -> None:
            nonlocal gone
            await wait_disconnect(receive)
            if not ending:  # past the pump, a cancel would hit whatever the task runs next
                gone = True
                pumping.cancel()

        watcher = asyncio.create_task(watch())
        try:
            await self._pump(send)
        except asyncio.CancelledError:
            if not gone:  # cancelled from outside (the server's shutdown): that goes on
                raise
            # The cancel was ours. Python 3.11+ counts cancels: one from outside as well goes on.
            uncancel = getattr(pumping, "uncancel", None)
            if uncancel is not None and uncancel() > 0:
                raise
        finally:
            ending = True
            watcher.cancel()
            self.on_close()

    async def _pump(self, send: Send) -> None:
        try:
            async for chunk in self.events:
                if chunk.endswith(SSE_DONE):  # the last event: the response ends in its write
                    await send({"type": "http.response.body", "body": chunk, "more_body": False})
                    return
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            await self.events.aclose()


async def merge(streams: list[RequestStream]) -> AsyncIterator[tuple[int, RequestOutput]]:
    """Interleaves several RequestStreams as (index, output), in arrival order."""
    if len(streams) == 1:
        async for out in streams[0]:
            yield 0, out
        return
    # (index, an output, the exception that ended the stream, or None once the stream is done)
    queue: asyncio.Queue[tuple[int, RequestOutput | Exception | None]] = asyncio.Queue()

    async def feed(index: int, stream: RequestStream) -> None:
        try:
            async for out in stream:
                queue.put_nowait((index, out))
        except Exception as exc:  # surfaced to the consumer
            queue.put_nowait((index, exc))
        queue.put_nowait((index, None))

    tasks = [asyncio.create_task(feed(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(streams)
        while remaining:
            index, item = await queue.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()


def engine_error(exc: EngineError) -> APIError:
    """What a request the engine ended with an error answers: 503 when the request was not at
    fault and may be retried (shed for its deadline; cut by the shutdown, with Retry-After and
    Connection: close, as a draining server refuses new work), 400 when its own grammar failed
    mid-answer, else 500."""
    if isinstance(exc, DeadlineExceeded):
        return APIError(503, str(exc), code="deadline_exceeded")
    if isinstance(exc, ConstraintFailed):
        return APIError(400, str(exc), code="grammar_failed")
    if isinstance(exc, ShutDown):
        return APIError(503, str(exc), code="shutting_down", headers={"Retry-After": "1", "Connection": "close"})
    return APIError(500, str(exc))


def stream_error(exc: EngineError) -> dict:
    """The error event that ends a stream the engine failed (its 200 was already sent)."""
    return engine_error(exc).body()
