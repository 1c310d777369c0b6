"""Deterministic executors without a model, for scheduler and engine tests, and a tokenizer
that spells each id."""
from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass
from typing import Callable, Sequence

from prelude.contract.batch import (
    BatchResult,
    DecodeBatch,
    ForwardBatch,
    OneShotBatch,
    OutputSpec,
    RowResult,
    TokenLogprob,
    decode_rows,
    prefill_rows,
)
from prelude.contract.stop import StopFlag
from prelude.engine.cost_model import PRIOR_FIXED_S, PRIOR_PER_TOKEN_S
from prelude.executor.executors import Executor
from prelude.tokenizer.base import Tokenizer
from tests.engine.clock import FakeClock


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


# A long OneShot step looks at its StopFlag after every piece of this many tokens (the model
# runner looks between pieces of about engine.preemption.CHECK_EVERY_MACS).
PIECE_TOKENS = 512


def step_tokens(batch: ForwardBatch) -> int:
    """Tokens the step computes: its prompt rows' and one per decode row."""
    return sum(len(r.token_ids) for r in prefill_rows(batch)) + len(decode_rows(batch))


@dataclass(frozen=True, slots=True)
class Ran:
    """One step the executor ran: its kind, its rows' seq ids, and whether it could step aside."""

    kind: str  # "oneshot" | "decode" | "mixed"
    seq_ids: frozenset[int]
    preemptible: bool = False


@dataclass(slots=True)
class LongRun:
    """A preemptible step in progress: how many of its tokens are still to compute."""

    batch: OneShotBatch
    left: int
    parks: int = 0


class SimulatedExecutor(CountingExecutor):
    """CountingExecutor's tokens, taking simulated time: each step moves `clock` by what the cost
    model's prior predicts for its tokens, so the engine's cost model agrees with it from the first
    step. It serves as all three executors (`Executors(sim, sim, sim)`): a preemptible OneShot step
    (`start` / `advance`) runs in pieces of PIECE_TOKENS and parks at the first look at its flag
    that finds it raised, as the model runner does. `before_piece`, when set, is called in the
    engine's worker before every step and every piece of one (see Pause)."""

    def __init__(self, clock: FakeClock, vocab: int = 1000):
        super().__init__(vocab)
        self.clock = clock
        self.ran: list[Ran] = []
        self.before_piece: Callable[[ForwardBatch], None] | None = None

    def execute(self, batch: ForwardBatch, on_launch: Callable[[], None] | None = None) -> BatchResult:
        self.ran.append(Ran(_kind(batch), seq_ids(batch)))
        self._compute(batch, step_tokens(batch), first=True)
        if on_launch is not None:
            on_launch()
        return super().execute(batch)

    def start(self, batch: OneShotBatch, stop: StopFlag) -> LongRun:
        self.ran.append(Ran("oneshot", seq_ids(batch), preemptible=True))
        return LongRun(batch, step_tokens(batch))

    def advance(self, run: LongRun, stop: StopFlag) -> BatchResult | None:
        while True:
            piece = min(PIECE_TOKENS, run.left)
            self._compute(run.batch, piece, first=run.left == step_tokens(run.batch))
            run.left -= piece
            if not run.left:
                return super().execute(run.batch)
            if stop.is_set():
                run.parks += 1
                return None

    def _compute(self, batch: ForwardBatch, tokens: int, first: bool) -> None:
        if self.before_piece is not None:
            self.before_piece(batch)
        self.clock.advance((PRIOR_FIXED_S if first else 0.0) + PRIOR_PER_TOKEN_S * tokens)


def _kind(batch: ForwardBatch) -> str:
    if isinstance(batch, OneShotBatch):
        return "oneshot"
    return "decode" if isinstance(batch, DecodeBatch) else "mixed"


def seq_ids(batch: ForwardBatch) -> frozenset[int]:
    return frozenset(r.seq_id for r in (*prefill_rows(batch), *decode_rows(batch)))


class Pause:
    """Holds the engine's worker at the first step (or piece of one) that `when` picks, until the
    test lets it go: the test acts on the engine while that step is in flight. Install it as a
    SimulatedExecutor's `before_piece`."""

    def __init__(self, when: Callable[[ForwardBatch], bool]):
        self.when = when
        self._reached = threading.Event()
        self._go = threading.Event()

    def __call__(self, batch: ForwardBatch) -> None:
        if not self._reached.is_set() and self.when(batch):
            self._reached.set()
            assert self._go.wait(30), "the test never let the step go on"

    async def reached(self) -> None:
        assert await asyncio.to_thread(self._reached.wait, 30), "the step never ran"

    def release(self) -> None:
        self._go.set()


class NumberTokenizer(Tokenizer):
    """Token id n reads " n"; no special tokens."""

    backend = "numbers"

    def __init__(self, vocab: int = 1000):
        self._vocab_size = vocab
        self._special_ids = frozenset()

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [int(word) for word in text.split()]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return "".join(f" {i}" for i in ids)

    def token_to_id(self, token: str) -> int | None:
        return int(token) if token.strip().isdigit() else None

    def id_to_token(self, token_id: int) -> str | None:
        return f" {token_id}"
