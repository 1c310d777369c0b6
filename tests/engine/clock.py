"""A clock for engine tests: it stands still until the test (or a simulated executor) moves it,
so that what the engine decides by the time (cost estimates, aging, deadlines, when a long step
is asked to step aside) is decided the same way on every run, however busy the machine is."""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable

from prelude.engine.clock import Clock


@dataclass(slots=True)
class _Timer:
    at: float
    callback: Callable[[], None]
    cancelled: bool = False

    def cancel(self) -> None:
        self.cancelled = True


class FakeClock(Clock):
    """Seconds that pass only through `advance`. A timer fires in the thread that moves the
    clock past it (the engine's timers only raise a StopFlag, which any thread may do)."""

    def __init__(self, start: float = 1000.0):
        self._now = start
        self._timers: list[_Timer] = []
        self._lock = threading.Lock()

    def __call__(self) -> float:
        return self._now

    def call_later(self, delay: float, callback: Callable[[], None]) -> _Timer:
        timer = _Timer(self._now + delay, callback)
        with self._lock:
            self._timers.append(timer)
        return timer

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds
            due = [t for t in self._timers if t.at <= self._now]
            self._timers = [t for t in self._timers if t.at > self._now and not t.cancelled]
        for timer in due:
            if not timer.cancelled:
                timer.callback()
