"""The engine's one worker thread, where forwards run while the event loop serves HTTP.

A queue of calls in, and each result posted back to the loop with one call_soon_threadsafe: a
concurrent.futures pool round trip (its own Future, chained to an asyncio one through two
callbacks) cost about twice the CPU of this, and a one-token request pays it once per step."""
from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from typing import Any, Callable, ContextManager, TypeVar

T = TypeVar("T")

_STOP = object()


class Worker:
    def __init__(self, name: str, context: Callable[[], ContextManager[Any]] = contextlib.nullcontext):
        """`context`: entered by the thread around all its calls (the executors' thread state)."""
        self._context = context
        self._calls: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """fn(*args) in the worker; its result or exception here."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._calls.put((loop, future, fn, args))
        return await future

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        """fn(*args) in the worker, its result dropped (fn reports back itself)."""
        self._calls.put((None, None, fn, args))

    def shutdown(self) -> None:
        """Runs the calls already queued, then ends the thread."""
        self._calls.put(_STOP)
        self._thread.join()

    def _serve(self) -> None:
        with self._context():
            self._serve_calls()

    def _serve_calls(self) -> None:
        while (item := self._calls.get()) is not _STOP:
            loop, future, fn, args = item
            try:
                result = fn(*args)
            except BaseException as exc:  # noqa: BLE001 (the caller re-raises it)
                if loop is not None:
                    loop.call_soon_threadsafe(_settle, future, None, exc)
                continue
            if loop is not None:
                loop.call_soon_threadsafe(_settle, future, result, None)


def _settle(future: asyncio.Future, result: Any, error: BaseException | None) -> None:
    if future.cancelled():  # the awaiting task was cancelled (engine shutdown)
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
