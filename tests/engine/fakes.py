"""A deterministic executor without a model, for scheduler and engine tests."""
from __future__ import annotations

from typing import Callable

from prelude.contract.batch import (
    BatchResult,
    ForwardBatch,
    OutputSpec,
    RowResult,
    TokenLogprob,
    decode_rows,
    prefill_rows,
)
from prelude.executor.executors import Executor


class CountingExecutor:
    """Next token = (last token + 1) % vocab. Records every batch and the tokens it computed."""

    def __init__(self, vocab: int = 1000):
        self.vocab = vocab
        self.batches: list[ForwardBatch] = []

    def execute(self, batch: ForwardBatch, on_launch: Callable[[], None] | None = None) -> BatchResult:
        self.batches.append(batch)
        rows = [self._result(r.seq_id, r.token_ids[-1], r.output) for r in prefill_rows(batch) if r.output]
        rows += [self._result(r.seq_id, r.token_id, r.output) for r in decode_rows(batch)]
        return BatchResult(rows)

    def _result(self, seq_id: int, last: int, spec: OutputSpec) -> RowResult:
        result = RowResult(seq_id)
        if spec.sample is not None:
            result.token = TokenLogprob((last + 1) % self.vocab, -0.5, [])
        if spec.pooling is not None:
            result.pooled = [1.0]
        return result

    @property
    def computed_tokens(self) -> list[int]:
        return [sum(len(r.token_ids) for r in prefill_rows(b)) + len(decode_rows(b)) for b in self.batches]


class PoisonedExecutor:
    """The fault-injection hook of the isolation tests: wraps a real executor and raises for
    any step holding a row that carries the poison token id, as a row the kernels choke on would."""

    def __init__(self, inner: Executor, poison: int):
        self.inner = inner
        self.poison = poison
        self.raised = 0

    def execute(self, batch: ForwardBatch, on_launch: Callable[[], None] | None = None) -> BatchResult:
        if any(self.poison in r.token_ids for r in prefill_rows(batch)) or \
                any(r.token_id == self.poison for r in decode_rows(batch)):
            self.raised += 1
            raise RuntimeError("injected fault: poisoned row")
        return self.inner.execute(batch, on_launch)
