"""The three executors, one per execution class, behind one protocol and sharing one model
runner. Each decides how its kind of step is launched; the runner does the work.

- OneShotExecutor: a ragged varlen forward over prompt slices, last-position gather, heads;
  a single fresh row may replay a prefill CUDA graph.
- DecodeExecutor: one token per running sequence over the paged cache; CUDA-graph replay.
- MixedExecutor: prefill chunks beside running decodes, always eager.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

from prelude.contract.batch import BatchResult, DecodeBatch, ForwardBatch, MixedBatch, OneShotBatch
from prelude.executor.runner import ModelRunner, Progress


class Executor(Protocol):
    """Runs one batch to completion and returns its results in host memory. Called from a
    single worker thread, never concurrently; the engine's event loop stays free meanwhile."""

    def execute(self, batch: ForwardBatch) -> BatchResult: ...


class OneShotExecutor:
    def __init__(self, runner: ModelRunner):
        self.runner = runner

    def start(self, batch: OneShotBatch) -> Progress:
        """A long step that can step aside between layers (see ModelRunner.advance)."""
        return self.runner.start(batch.rows)

    def advance(self, progress: Progress, should_stop: Callable[[], bool]) -> BatchResult | None:
        return self.runner.advance(progress, should_stop)

    def execute(self, batch: ForwardBatch) -> BatchResult:
        assert isinstance(batch, OneShotBatch)
        rows = batch.rows
        # Prefill graphs attend causally: a multi-item row needs its mask, planned eagerly.
        fresh_single_row = len(rows) == 1 and rows[0].start == 0 and not rows[0].item_lengths
        return self.runner.run(rows, (), "prefill" if fresh_single_row else None)


class DecodeExecutor:
    def __init__(self, runner: ModelRunner):
        self.runner = runner

    def execute(self, batch: ForwardBatch) -> BatchResult:
        assert isinstance(batch, DecodeBatch)
        return self.runner.run((), batch.rows, "decode")


class MixedExecutor:
    def __init__(self, runner: ModelRunner):
        self.runner = runner

    def execute(self, batch: ForwardBatch) -> BatchResult:
        assert isinstance(batch, MixedBatch)
        return self.runner.run(batch.prefills, batch.decodes)


@dataclass(frozen=True, slots=True)
class Executors:
    """One executor per batch kind. `execute` dispatches on the batch's type, the only place
    that decides which executor runs a step."""

    oneshot: OneShotExecutor
    decode: Executor
    mixed: Executor

    @classmethod
    def over(cls, runner: ModelRunner) -> Executors:
        return cls(OneShotExecutor(runner), DecodeExecutor(runner), MixedExecutor(runner))

    def for_batch(self, batch: ForwardBatch) -> Executor:
        if isinstance(batch, OneShotBatch):
            return self.oneshot
        if isinstance(batch, DecodeBatch):
            return self.decode
        return self.mixed

    def execute(self, batch: ForwardBatch) -> BatchResult:
        return self.for_batch(batch).execute(batch)
