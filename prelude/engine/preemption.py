"""Which OneShot steps may step aside for which requests (FlowPrefill's cooperative preemption),
decided here once for the scheduler, which keeps such rows in separate steps, and for the step
runner, which parks a long step while short work waits. Torch-free, like the scheduler."""
from __future__ import annotations

from prelude.engine.cost_model import StepCostModel

# A OneShot step predicted to take at least this long may step aside for short requests...
PREEMPTIBLE_S = 0.05
# ...that are at most this fraction of its longest row. The longest row, not the step's total:
# a step of sixteen 128-token rows is a batch of short work, and parking it for the next
# 128-token arrival broke batching up (embeddings at c=16 ran at half the rate).
SHORT_SHARE = 1 / 8


def preemptible(costs: StepCostModel, tokens: int) -> bool:
    """A step computing `tokens` is long enough to step aside between layers."""
    return costs.estimate(tokens) >= PREEMPTIBLE_S


def short_beside(tokens: int, long_tokens: int) -> bool:
    """A row of `tokens` is short work that a step whose longest row has `long_tokens` steps
    aside for."""
    return tokens <= SHORT_SHARE * long_tokens


def kept_apart(costs: StepCostModel, tokens: int, other_tokens: int) -> bool:
    """Rows of these sizes never share a step: the short one would wait for the whole long step
    instead of running while it is parked."""
    short, long = min(tokens, other_tokens), max(tokens, other_tokens)
    return short_beside(short, long) and preemptible(costs, long)
