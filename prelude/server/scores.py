"""Head outputs as API scores: the probabilities and relevance the decision endpoints report."""
from __future__ import annotations

import math
from typing import TypeVar

T = TypeVar("T")


def required(value: T | None) -> T:
    """An output the row's OutputSpec asked for, which the executor always fills."""
    assert value is not None, "the executor left out an output the row asked for"
    return value


def softmax(values: list[float]) -> list[float]:
    top = max(values)
    exps = [math.exp(v - top) for v in values]
    total = sum(exps)
    return [e / total for e in exps]


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


def pair_relevance(logits: list[float]) -> float:
    """Cross-encoder relevance: sigmoid of a single logit, else the probability of label 1."""
    return sigmoid(logits[0]) if len(logits) == 1 else softmax(logits)[1]
