"""The executor interface: the only thing the engine knows about devices."""
from __future__ import annotations

from abc import ABC, abstractmethod

from prelude.engine.batch import BatchResult, ForwardBatch


class Executor(ABC):
    """Runs one ForwardBatch to completion and returns its results in host memory.

    Called from a single worker thread, never concurrently; the engine's event loop stays free
    while a step runs."""

    @abstractmethod
    def execute(self, batch: ForwardBatch) -> BatchResult: ...

    def warmup(self) -> None:
        """Pay one-time costs (kernel compilation, graph capture) before serving."""
