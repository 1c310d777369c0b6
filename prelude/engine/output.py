"""What the engine hands back to the server: per-request outputs on an async stream."""
from __future__ import annotations

import asyncio
import enum
from collections import deque
from dataclasses import dataclass, field

from prelude.contract.batch import TokenLogprob
from prelude.contract.record import record


class FinishReason(str, enum.Enum):
    STOP = "stop"  # EOS, a stop token or a stop string
    LENGTH = "length"  # max_tokens reached, or a OneShot request's single forward done
    ABORT = "abort"  # the client went away, or the server stopped
    ERROR = "error"  # the request's own row made a step raise


@record
class RequestMetrics:
    """How one request went through the engine, on its last output (the access log reads it)."""

    execution_class: str  # OneShot | Decode | Mixed (its prompt ran beside other requests' decodes)
    queue_s: float  # arrival to its first scheduled step
    ttft_s: float | None  # arrival to its first output (a OneShot request's result); None: never ran


@dataclass(slots=True)
class RequestOutput:
    """An increment of a request's result. Streams carry the new tokens and text of each step;
    the last output has `finished` set. OneShot requests produce exactly one output."""

    request_id: str
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    logprobs: list[TokenLogprob] | None = None
    prompt_logprobs: list[TokenLogprob] | None = None
    pooled: list[float] | None = None
    scores: list[float] | None = None
    label_logprobs: list[float] | None = None
    item_label_logprobs: list[list[float]] | None = None
    finished: bool = False
    finish_reason: FinishReason | None = None
    stop_reason: str | int | None = None  # the stop string or token id that ended generation
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    num_cached_tokens: int = 0
    metrics: RequestMetrics | None = None  # on the last output of a request that ended normally


class EngineError(RuntimeError):
    """The engine failed this request (the step it was in raised); other requests go on."""


class ConstraintFailed(EngineError):
    """The request's own grammar could not go on mid-answer (contract.constraint.GrammarFailed):
    the request's fault, answered as a bad request."""


class Overloaded(EngineError):
    """The request was not admitted: the waiting queue is full, or the server is draining.
    Nothing was queued; the client may retry."""


class DeadlineExceeded(EngineError):
    """The request could no longer meet its deadline and was shed before running."""


class ShutDown(EngineError):
    """The server shut down (its drain timed out) before the request finished: nothing was
    wrong with the request, and another replica may serve it."""


class RequestStream:
    """Async iterator over one request's outputs, fed by the engine loop (same event loop).
    A deque and at most one waiting future: an asyncio.Queue per request costs more than the
    rest of a OneShot request's bookkeeping."""

    __slots__ = ("request_id", "key", "_items", "_waiter", "finished", "metrics")

    def __init__(self, request_id: str, key: int):
        self.request_id = request_id  # the caller's name, which two requests in flight may share
        self.key = key  # the engine's own, unique: what Engine.abort finds the request by
        self._items: deque[RequestOutput | Exception] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self.finished = False
        # Known from its first output on (none changes after it): a stream its client left has
        # them for the access log before its last output.
        self.metrics: RequestMetrics | None = None

    def put(self, item: RequestOutput | Exception) -> None:
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> RequestOutput:
        if self.finished:
            raise StopAsyncIteration
        items = self._items
        while not items:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        item = items.popleft()
        if isinstance(item, Exception):
            self.finished = True
            raise item
        self.finished = item.finished
        return item

    def last_queued(self) -> RequestOutput | None:
        """The newest output queued and not yet taken (an abort's counts, where the reader has
        gone), without waiting."""
        return next((item for item in reversed(self._items) if isinstance(item, RequestOutput)), None)

    async def first(self) -> None:
        """Waits until the stream holds an output, without taking it; raises the error that
        ended the stream instead, if that came first (as the next item would)."""
        head = await self.__anext__()
        self._items.appendleft(head)
        self.finished = False

    async def collect(self) -> RequestOutput:
        """Waits for the end and merges every increment into one output."""
        merged: RequestOutput | None = None
        async for out in self:
            if merged is None:
                merged = out
                continue
            merged.token_ids += out.token_ids
            merged.text += out.text
            if out.logprobs is not None:
                merged.logprobs = (merged.logprobs or []) + out.logprobs
            for name in ("finished", "finish_reason", "stop_reason", "num_output_tokens",
                         "prompt_logprobs", "pooled", "scores", "label_logprobs", "item_label_logprobs",
                         "metrics"):
                value = getattr(out, name)
                if value is not None:
                    setattr(merged, name, value)
        # A fresh stream yields at least its finished output; only a stream already read to its end
        # yields nothing.
        assert merged is not None, f"collect() on the finished stream of {self.request_id}"
        return merged
