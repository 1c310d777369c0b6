"""The three executors, one per execution class, behind one protocol and sharing one model
runner. Each decides how its kind of step is launched; the runner does the work.

- OneShotExecutor: a ragged varlen forward over prompt slices, last-position gather, heads;
  a step of fresh rows replays a prefill CUDA graph instead, where the runner has one.
- DecodeExecutor: one token per running sequence over the paged cache; CUDA-graph replay.
- MixedExecutor: prefill chunks beside running decodes in one eager forward, or, for fresh
  rows, as two graph replays (the rows' prefill graph, then the decode graph).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Protocol, Sequence

import torch

from prelude.contract.batch import BatchResult, DecodeBatch, ForwardBatch, MixedBatch, OneShotBatch, PrefillRow
from prelude.contract.stop import StopFlag
from prelude.executor.runner import ModelRunner, Progress
from prelude.model.attention import GraphKind


class Executor(Protocol):
    """Runs one batch to completion and returns its results in host memory. Called from a
    single worker thread, never concurrently; the engine's event loop stays free meanwhile."""

    def execute(self, batch: ForwardBatch, on_launch: Callable[[], None] | None = None) -> BatchResult: ...


class OneShotExecutor:
    def __init__(self, runner: ModelRunner):
        self.runner = runner

    def start(self, batch: OneShotBatch, stop: StopFlag) -> Progress:
        """A long step that steps aside when `stop` is raised (see ModelRunner.advance)."""
        return self.runner.start(batch.rows, stop)

    def advance(self, progress: Progress, stop: StopFlag) -> BatchResult | None:
        return self.runner.advance(progress, stop)

    def execute(self, batch: ForwardBatch, on_launch: Callable[[], None] | None = None) -> BatchResult:
        assert isinstance(batch, OneShotBatch)
        graph: GraphKind | None = "prefill" if _replayable(self.runner, batch.rows) else None
        return self.runner.run(batch.rows, (), graph, on_launch)


def _fresh(row: PrefillRow) -> bool:
    """Whether a prefill graph can take the row: it attends causally from position 0, so
    not over a cached prefix, and not a multi-item row (which needs its mask)."""
    return row.start == 0 and not row.item_lengths


def _replayable(runner: ModelRunner, rows: Sequence[PrefillRow]) -> bool:
    """Whether these rows run as one prefill graph replay."""
    return (len(rows) > 0 and all(_fresh(r) for r in rows)
            and runner.has_graph("prefill", sum(len(r.token_ids) for r in rows), len(rows)))


class DecodeExecutor:
    def __init__(self, runner: ModelRunner):
        self.runner = runner

    def execute(self, batch: ForwardBatch, on_launch: Callable[[], None] | None = None) -> BatchResult:
        assert isinstance(batch, DecodeBatch)
        return self.runner.run((), batch.rows, "decode", on_launch)


class MixedExecutor:
    """Fresh prefill rows (new streams' prompts) beside decodes run as two graph replays where
    the runner has the graphs, the rows' prefill graph then the decode graph: a small model's
    eager step is bound by the host launching its kernels, and every running stream would wait
    for it (`python -m bench.serving.gpu_profile`)."""

    def __init__(self, runner: ModelRunner):
        self.runner = runner

    def execute(self, batch: ForwardBatch, on_launch: Callable[[], None] | None = None) -> BatchResult:
        assert isinstance(batch, MixedBatch)
        prefills, decodes = batch.prefills, batch.decodes
        if _replayable(self.runner, prefills) and (not decodes or self.runner.has_graph("decode", len(decodes),
                                                                                         len(decodes))):
            first = self.runner.run(prefills, (), "prefill")
            return BatchResult(first.rows + (self.runner.run((), decodes, "decode").rows if decodes else []))
        return self.runner.run(prefills, decodes, on_launch=on_launch)


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

    def execute(self, batch: ForwardBatch, on_launch: Callable[[], None] | None = None) -> BatchResult:
        return self.for_batch(batch).execute(batch, on_launch)

    @staticmethod
    def thread_context() -> ContextManager[Any]:
        """What the thread that runs the steps holds for its life: torch's inference mode, which
        the runner would otherwise enter and leave every step (runner.in_inference_mode)."""
        return torch.inference_mode()
