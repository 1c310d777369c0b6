"""The three executors, one per execution class, behind one protocol and sharing one model
runner. Each decides how its kind of step is launched; the runner does the work.

- OneShotExecutor: a ragged varlen forward over prompt slices, last-position gather, heads;
  a step of fresh rows replays a prefill CUDA graph instead, where the runner has one.
- DecodeExecutor: one token per running sequence over the paged cache; CUDA-graph replay.
- MixedExecutor: prefill chunks beside running decodes in one eager forward, or, for fresh
  rows, as two graph replays (the rows' prefill graph, then the decode graph).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, ContextManager, Protocol, Sequence

from prelude.contract.batch import (BatchResult, DecodeBatch, DecodeRow, ForwardBatch, MixedBatch, OneShotBatch,
                                    PrefillRow)
from prelude.contract.stop import StopFlag

if TYPE_CHECKING:
    from prelude.model.attention import GraphKind


class Runner(Protocol):
    """What the executors call on a model runner: executor.runner's ModelRunner (torch, CPU or
    CUDA) or executor.host_runner's HostRunner (the CPU's native kernels without torch)."""

    def run(self, prefills: Sequence[PrefillRow], decodes: Sequence[DecodeRow], graph: GraphKind | None = None,
            on_launch: Callable[[], None] | None = None) -> BatchResult: ...

    def start(self, prefills: Sequence[PrefillRow], stop: StopFlag) -> Any: ...

    def advance(self, progress: Any, stop: StopFlag) -> BatchResult | None: ...

    def has_graph(self, kind: GraphKind, tokens: int, rows: int) -> bool: ...

    def thread_context(self) -> ContextManager[Any]: ...

    def warmup(self) -> None: ...


class Executor(Protocol):
    """Runs one batch to completion and returns its results in host memory. Called from a
    single worker thread, never concurrently; the engine's event loop stays free meanwhile."""

    def execute(self, batch: ForwardBatch, on_launch: Callable[[], None] | None = None) -> BatchResult: ...


class OneShotExecutor:
    def __init__(self, runner: Runner):
        self.runner = runner

    def start(self, batch: OneShotBatch, stop: StopFlag) -> Any:
        """A long step that steps aside when `stop` is raised (see Runner.advance)."""
        return self.runner.start(batch.rows, stop)

    def advance(self, progress: Any, stop: StopFlag) -> BatchResult | None:
        return self.runner.advance(progress, stop)

    def execute(self, batch: ForwardBatch, on_launch: Callable[[], None] | None = None) -> BatchResult:
        assert isinstance(batch, OneShotBatch)
        graph: GraphKind | None = "prefill" if _replayable(self.runner, batch.rows) else None
        return self.runner.run(batch.rows, (), graph, on_launch)


def _fresh(row: PrefillRow) -> bool:
    """Whether a prefill graph can take the row: it attends causally from position 0, so
    not over a cached prefix, and not a multi-item row (which needs its mask)."""
    return row.start == 0 and not row.item_lengths


def _replayable(runner: Runner, rows: Sequence[PrefillRow]) -> bool:
    """Whether these rows run as one prefill graph replay."""
    return (len(rows) > 0 and all(_fresh(r) for r in rows)
            and runner.has_graph("prefill", sum(len(r.token_ids) for r in rows), len(rows)))


class DecodeExecutor:
    def __init__(self, runner: Runner):
        self.runner = runner

    def execute(self, batch: ForwardBatch, on_launch: Callable[[], None] | None = None) -> BatchResult:
        assert isinstance(batch, DecodeBatch)
        return self.runner.run((), batch.rows, "decode", on_launch)


class MixedExecutor:
    """Fresh prefill rows (new streams' prompts) beside decodes run as two graph replays where
    the runner has the graphs, the rows' prefill graph then the decode graph: a small model's
    eager step is bound by the host launching its kernels, and every running stream would wait
    for it (`python -m bench.serving.gpu_profile`)."""

    def __init__(self, runner: Runner):
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
    # What the thread that runs the steps holds for its life (Runner.thread_context).
    thread_context: Callable[[], ContextManager[Any]] = contextlib.nullcontext

    @classmethod
    def over(cls, runner: Runner) -> Executors:
        return cls(OneShotExecutor(runner), DecodeExecutor(runner), MixedExecutor(runner), runner.thread_context)

    def for_batch(self, batch: ForwardBatch) -> Executor:
        if isinstance(batch, OneShotBatch):
            return self.oneshot
        if isinstance(batch, DecodeBatch):
            return self.decode
        return self.mixed

    def execute(self, batch: ForwardBatch, on_launch: Callable[[], None] | None = None) -> BatchResult:
        return self.for_batch(batch).execute(batch, on_launch)
