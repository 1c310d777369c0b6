"""The typed vocabulary of one scheduling tick: the step budget, what a planner answers for a
piece of work, the planned step, and the events folded back after it."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import NamedTuple

from prelude.contract.batch import ForwardBatch, RowResult
from prelude.engine.work import OneShotJob, Sequence, Work


class Skip(enum.Enum):
    """Why a planner did not place work in this tick's step."""

    DEFERRED = "deferred"  # waits one tick behind a leader computing the same uncached prefix
    NO_ROOM = "no_room"  # the step's budget, the sequence slots or the KV pool are spent


class StepBudget:
    """Token and temporary-memory budget of one step; admits or refuses one piece at a time.
    The first piece always fits, so an oversize OneShot row runs alone rather than never."""

    def __init__(self, tokens: int, temp_bytes: int):
        self.tokens_left = tokens
        self.temp_left = temp_bytes
        self.empty = True

    def fits(self, tokens: int, temp_bytes: int = 0) -> bool:
        return self.empty or (tokens <= self.tokens_left and temp_bytes <= self.temp_left)

    def take(self, tokens: int, temp_bytes: int = 0) -> None:
        self.tokens_left -= tokens
        self.temp_left -= temp_bytes
        self.empty = False


class PlannedOneShot(NamedTuple):
    job: OneShotJob
    blocks: list[int]  # attached cached blocks, then the new full blocks this step fills
    num_cached_blocks: int


class ScheduledStep(NamedTuple):
    batch: ForwardBatch
    oneshots: list[PlannedOneShot]
    prefills: list[tuple[Sequence, int]]  # (sequence, tokens computed this step)
    decodes: list[Sequence]


class StepEvent(NamedTuple):
    """One row's result handed back to the engine."""

    work: Work
    result: RowResult


@dataclass(slots=True)
class SchedulerStats:
    num_preemptions: int = 0
    num_deferrals: int = 0
    num_oneshot_rows: int = 0
    prefill_tokens: int = 0
    decode_tokens: int = 0
    steps: dict[str, int] = field(default_factory=lambda: {"oneshot": 0, "decode": 0, "mixed": 0})
