"""The typed vocabulary of one scheduling tick: the step budget, what a planner answers for a
piece of work, the planned step, and the events folded back after it."""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import NamedTuple

from prelude.contract.batch import DecodeBatch, ForwardBatch, OneShotBatch, RowResult
from prelude.engine.cost_model import StepCostModel
from prelude.engine.work import OneShotJob, Sequence, Work


# Decode prompts beside running decodes are cut into chunks predicted to take at most
# preemption.STREAM_GAP_S, but of at least this many tokens: shorter chunks cost generation
# with long prompts more output rate than they save the streams.
MIN_PROMPT_CHUNK = 2048


class Skip(enum.Enum):
    """Why a planner did not place work in this tick's step."""

    DEFERRED = "deferred"  # waits one tick behind a leader computing the same uncached prefix
    NO_ROOM = "no_room"  # the step's budget, the sequence slots or the KV pool are spent


class StepBudget:
    """Token, temporary-memory and (for deadline-aware batching) time budget of one step; admits
    or refuses one piece at a time. The first piece always fits, so an oversize OneShot row runs
    alone rather than never. With a cost model, a piece fits only if the step, grown by it, is
    still predicted to end before the most urgent deadline among its rows (FlowPrefill's
    SLO-aware batch sizing).

    Without deadlines a step takes all the waiting work that fits. That holds even on a CPU,
    where a step's time grows with its rows and batching saves little: smaller steps (capped with
    `--max-num-batched-tokens 128`) pay each step's fixed cost more often and make the tail worse
    (`python -m bench.serving.long_short`, its short requests alone)."""

    def __init__(self, tokens: int, temp_bytes: int, costs: StepCostModel | None = None,
                 now: float = 0.0, strict: bool = False):
        self.tokens_left = tokens
        self.temp_left = temp_bytes
        self.empty = not strict  # strict: even the first piece must fit (a step of short work only)
        self.costs = costs
        self.now = now
        self.tokens_taken = 0
        self.deadline = math.inf
        # Tokens of Decode prompts' chunks (the scheduler caps them beside running decodes).
        self.prefill_left = tokens

    def fits(self, tokens: int, temp_bytes: int = 0, deadline: float | None = None) -> bool:
        if self.empty:
            return True
        if tokens > self.tokens_left or temp_bytes > self.temp_left:
            return False
        if self.costs is None or self.deadline == math.inf:
            return True
        # The step may grow only while it keeps its most urgent row on time.
        return self.now + self.costs.estimate(self.tokens_taken + tokens) <= self.deadline

    def take(self, tokens: int, temp_bytes: int = 0, deadline: float | None = None) -> None:
        self.tokens_left -= tokens
        self.temp_left -= temp_bytes
        self.tokens_taken += tokens
        # Only a row the step still finishes in time for caps it: a row already late gains
        # nothing from a smaller step, and the rows behind it would lose throughput. (Capped by
        # a late row's past deadline, the step took every row after it, however urgent.)
        if deadline is not None and self.costs is not None \
                and self.now + self.costs.estimate(self.tokens_taken) <= deadline:
            self.deadline = min(self.deadline, deadline)
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
    num_tokens: int  # the tokens the step computes: its prompt rows' and one per decode


class StepEvent(NamedTuple):
    """One row's result handed back to the engine."""

    work: Work
    result: RowResult


@dataclass(slots=True)
class SchedulerStats:
    num_preemptions: int = 0
    num_deferrals: int = 0
    num_oneshot_rows: int = 0
    num_late: int = 0  # waiting requests shed because they could no longer meet their deadline
    prefill_tokens: int = 0
    decode_tokens: int = 0
    steps: dict[str, int] = field(default_factory=lambda: {"oneshot": 0, "decode": 0, "mixed": 0})

    def count(self, step: ScheduledStep) -> None:
        """Counts a step that ran (scheduled, or planned ahead and started)."""
        batch = step.batch
        kind = "decode" if isinstance(batch, DecodeBatch) else "oneshot" if isinstance(batch, OneShotBatch) else "mixed"
        self.steps[kind] += 1
        self.num_oneshot_rows += len(step.oneshots)
        self.prefill_tokens += step.num_tokens - len(step.decodes)
        self.decode_tokens += len(step.decodes)
