"""One tick of the scheduler: what it has planned so far (`Tick`), and what became of each
waiting piece offered to it (`Offer`). The scheduler fills a Tick; `Tick.step` turns it into the
step's typed batch."""
from __future__ import annotations

import enum
from typing import Callable

from prelude.cache.block_pool import BlockKey
from prelude.contract.batch import DecodeBatch, ForwardBatch, MixedBatch, OneShotBatch, PrefillRow
from prelude.engine.decode_planner import DecodePlanner
from prelude.engine.plan import PlannedOneShot, ScheduledStep, StepBudget
from prelude.engine.work import Sequence, Work


class Offer(enum.Enum):
    """What became of one waiting piece offered to the tick."""
    TAKEN = "taken"  # its row is in the step
    PASS = "pass"  # not this tick; later pieces are still offered
    STOP = "stop"  # the step is full: no later piece is offered


class Tick:
    """What one tick has planned so far."""

    def __init__(self, now: float, budget: StepBudget, short: bool, alone: bool, decodes: list[Sequence],
                 chunks: list[tuple[Sequence, PrefillRow]],
                 apart: Callable[[bool, int, int, int], bool] | None):
        self.now = now
        self.budget = budget
        self.short = short  # a short step, run while a long one is parked
        self.alone = alone  # the row held apart last tick: no decodes, no prompt chunks
        self.decodes = decodes
        self.chunks = chunks
        self.beside_streams = bool(decodes or chunks)
        self.apart = apart  # layer preemption's split of short from long work, when it applies
        self.prefills: list[tuple[Sequence, int]] = [(seq, len(row.token_ids)) for seq, row in chunks]
        self.rows: list[PrefillRow] = [row for _, row in chunks]
        self.oneshots: list[PlannedOneShot] = []
        self.pending: set[BlockKey] = set()  # first uncached block of each prefix computed this tick
        self.admitted: list[Work] = []
        self.decode_full = False  # no more Decode admissions this tick; OneShot work can still go
        self.long_tokens = 0  # the longest preemptible OneShot row planned
        self.shortest = 0  # the fewest tokens of waiting work admitted (0: none yet)

    @property
    def only_streams_in_way(self) -> bool:
        """Running streams' decodes or chunks are in the step and nothing waiting was admitted: a
        row refused now is held apart, to get the next tick without them."""
        return self.beside_streams and len(self.rows) == len(self.chunks)

    def take(self, work: Work, tokens: int) -> None:
        """`work`, of `tokens` to compute when offered, is in the step."""
        self.shortest = min(self.shortest, tokens) if self.shortest else tokens
        if work.first_scheduled is None:
            work.first_scheduled = self.now
        self.admitted.append(work)

    def step(self, decode: DecodePlanner) -> ScheduledStep | None:
        if not self.rows and not self.decodes:
            return None
        decoding_rows = [decode.decode_row(s) for s in self.decodes]
        batch: ForwardBatch
        if not self.rows:
            batch = DecodeBatch(decoding_rows)
        elif not decoding_rows and not self.prefills:
            batch = OneShotBatch(self.rows)
        else:
            batch = MixedBatch(self.rows, decoding_rows)
        num_tokens = sum(len(row.token_ids) for row in self.rows) + len(decoding_rows)
        return ScheduledStep(batch, self.oneshots, self.prefills, self.decodes, num_tokens)
