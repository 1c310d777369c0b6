"""Steps of decodes run back to back in the engine's worker thread, each planned while the one
before it runs (see DecodeChain)."""
from __future__ import annotations

import asyncio
import queue
from collections import deque
from typing import Callable, Union

from prelude.contract.batch import BatchResult, DecodeBatch, DecodeRow, ForwardBatch
from prelude.engine.isolation import StepOutcome, execute_isolating

ChainItem = Union[tuple[StepOutcome, float, bool], BaseException]


class DecodeChain:
    """Steps of decodes run back to back in the worker (overlap scheduling, as SGLang's): while
    step N runs, the loop plans step N+1 and hands it over (`follow`); the worker starts it the
    moment N ends, with the tokens N sampled. N's outcome goes to the loop as N+1's forward is
    launched, so the loop folds it back (outputs, streams) while the forward's kernels run
    without the GIL: posted as soon as N ended, the folding would run beside N+1's Python, and
    the two threads' turns at the GIL would lengthen N+1 by as much as the hand-offs save
    (TPOT of generation at c=4: `python -m bench.serving.side_by_side`).

    The loop hands over exactly one decision (a step, or None to end the chain) per step it
    gave, before it awaits that step's outcome, so the worker waits for the loop only when the
    loop is slower than a step."""

    def __init__(self, loop: asyncio.AbstractEventLoop, clock: Callable[[], float], eos_token_ids: frozenset[int]):
        self._loop = loop
        self._clock = clock
        self._eos_token_ids = eos_token_ids
        self._decisions: queue.SimpleQueue[DecodeBatch | None] = queue.SimpleQueue()
        # Outcomes on the loop, and the loop's wait for the next: a deque and one future, where
        # an asyncio.Queue's put and get cost a streamed token about 5% of its loop time at c=1
        # (bench.serving.instructions).
        self._outcomes: deque[ChainItem] = deque()
        self._arrival: asyncio.Future[None] | None = None
        self._held: ChainItem | None = None  # the outcome of the step before the one running

    def follow(self, batch: DecodeBatch | None) -> None:
        """The step to run after the one given last (its rows' input tokens still to be filled
        in), or None: the chain ends there."""
        self._decisions.put(batch)

    async def outcome(self) -> tuple[StepOutcome, float, bool]:
        """The next step's outcome, its seconds in the worker, and whether its follower runs."""
        while not self._outcomes:
            self._arrival = self._loop.create_future()
            try:
                await self._arrival
            finally:
                self._arrival = None
        item = self._outcomes.popleft()
        if isinstance(item, BaseException):
            raise item
        return item

    def run(self, execute: Callable[..., BatchResult], batch: DecodeBatch | None) -> None:
        """In the worker: the steps, until a decision ends the chain. A step that raised ends it
        too (its rows' tokens are missing or suspect)."""
        def launched(b: ForwardBatch) -> BatchResult:
            return execute(b, self._post_held)

        try:
            while batch is not None:
                started = self._clock()
                outcome = execute_isolating(launched, batch)
                self._post_held()  # the step never launched (it failed first)
                seconds = self._clock() - started
                follow = self._decisions.get()
                batch = None if follow is None or outcome.first_error else with_sampled_tokens(follow, outcome.result,
                                                                                             self._eos_token_ids)
                self._held = (outcome, seconds, batch is not None)
                if batch is None:
                    self._post_held()
        except BaseException as exc:  # noqa: BLE001 (the loop re-raises it: an engine bug)
            self._post_held()
            self._post(exc)

    def _post_held(self) -> None:
        if self._held is not None:
            held, self._held = self._held, None
            self._post(held)

    def _post(self, item: ChainItem) -> None:
        self._loop.call_soon_threadsafe(self._arrive, item)

    def _arrive(self, item: ChainItem) -> None:
        """On the loop: an outcome, for `outcome()`."""
        self._outcomes.append(item)
        if self._arrival is not None and not self._arrival.done():
            self._arrival.set_result(None)


def with_sampled_tokens(batch: DecodeBatch, result: BatchResult, eos_token_ids: frozenset[int]) -> DecodeBatch | None:
    """A step planned ahead, its rows' input tokens (and penalty histories) completed with what
    the step before sampled; None if a row has no token there, or no row is left. A row whose
    token ended its sequence (EOS, a stop token: the rule the fold applies, so the fold skips
    the row) is dropped: planned before that token was known, it would cost a forward row and
    a row of the vocabulary's logits for a result no one reads. So is a row whose token a grammar
    followed with forced tokens: its next row computes them all (a prefill chunk the next
    scheduled step gives it), which a one-token row cannot."""
    sampled = {row.seq_id: (row.token.token_id, row.forced) for row in result.rows if row.token is not None}
    rows = []
    for row in batch.rows:
        if row.seq_id not in sampled:
            return None
        token, forced = sampled[row.seq_id]
        if forced or (row.output.sample is not None and row.output.sample.ends_at(token, eos_token_ids)):
            continue
        # Built field by field: dataclasses.replace took 2.5x as long, on every row of every
        # chained step, between one step's end and the next one's launch.
        rows.append(DecodeRow(row.seq_id, token, row.position, row.block_table, row.output, row.sample_step,
                              (*row.history, token) if row.history else ()))
    return DecodeBatch(rows) if rows else None
