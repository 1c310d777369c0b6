"""A deterministic executor without a model, for scheduler and engine tests."""
from __future__ import annotations

from prelude.engine.batch import (
    BatchResult,
    ForwardBatch,
    OutputSpec,
    RowResult,
    TokenLogprob,
    decode_rows,
    prefill_rows,
)
from prelude.executor.base import Executor


class CountingExecutor(Executor):
    """Next token = (last token + 1) % vocab. Records every batch and the tokens it computed."""

    def __init__(self, vocab: int = 1000):
        self.vocab = vocab
        self.batches: list[ForwardBatch] = []
        self.fail_next = False

    def execute(self, batch: ForwardBatch) -> BatchResult:
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("injected failure")
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
