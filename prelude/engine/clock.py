"""Where the engine reads the time and sets its timers. By default the system's monotonic clock
and the running event loop's timers; tests pass a clock that moves only when they move it
(tests/engine/clock.py), so that every decision the engine takes by the time is taken the same
way on every run."""
from __future__ import annotations

import asyncio
import time
from typing import Callable, Protocol


class Timer(Protocol):
    def cancel(self) -> None: ...


class Clock:
    """Seconds from time.monotonic(); timers on the running event loop."""

    def __call__(self) -> float:
        return time.monotonic()

    def call_later(self, delay: float, callback: Callable[[], None]) -> Timer:
        return asyncio.get_running_loop().call_later(delay, callback)


SYSTEM_CLOCK = Clock()
