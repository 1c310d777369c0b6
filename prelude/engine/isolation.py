"""Runs a step so that one bad row cannot fail its neighbours. When the forward raises, the
step's rows are retried in halves until every failure is pinned on rows that fail alone; the
other rows' results are kept. Re-running a row is safe: it rewrites the same KV slots with the
same values, and seeded sampling depends only on (seed, step)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence, Union

from prelude.contract.batch import (
    BatchResult,
    DecodeBatch,
    DecodeRow,
    ForwardBatch,
    MixedBatch,
    OneShotBatch,
    PrefillRow,
    decode_rows,
    prefill_rows,
)

Row = Union[PrefillRow, DecodeRow]


@dataclass(slots=True)
class StepOutcome:
    result: BatchResult
    failures: dict[int, Exception] = field(default_factory=dict)  # seq_id -> what its row raised
    first_error: Exception | None = None  # what the whole step raised, when it did


def _subset(batch: ForwardBatch, rows: Sequence[Row]) -> ForwardBatch:
    """The same kind of batch over some of its rows (a Mixed step without prefills is a Decode
    step, so that each executor still sees a batch it plans for)."""
    prefills = [r for r in rows if isinstance(r, PrefillRow)]
    decodes = [r for r in rows if isinstance(r, DecodeRow)]
    if isinstance(batch, OneShotBatch):
        return OneShotBatch(prefills)
    if isinstance(batch, DecodeBatch) or not prefills:
        return DecodeBatch(decodes)
    return MixedBatch(prefills, decodes)


def execute_isolating(execute: Callable[[ForwardBatch], BatchResult], batch: ForwardBatch) -> StepOutcome:
    try:
        return StepOutcome(execute(batch))
    except Exception as exc:  # noqa: BLE001 (any failure of the forward is isolated, then reported)
        outcome, error = StepOutcome(BatchResult([]), first_error=exc), exc
    _bisect(execute, batch, [*prefill_rows(batch), *decode_rows(batch)], outcome, error)
    return outcome


def _bisect(execute: Callable[[ForwardBatch], BatchResult], batch: ForwardBatch, rows: list[Row],
            outcome: StepOutcome, error: Exception) -> None:
    """`rows` raised `error` together: run each half alone, and blame single rows only."""
    if len(rows) == 1:
        outcome.failures[rows[0].seq_id] = error
        return
    middle = len(rows) // 2
    for half in (rows[:middle], rows[middle:]):
        try:
            outcome.result.rows.extend(execute(_subset(batch, half)).rows)
        except Exception as exc:  # noqa: BLE001
            _bisect(execute, batch, half, outcome, exc)
