"""Engine statistics for /metrics: counters and latency histograms, updated between steps."""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from functools import partial
from typing import Callable

import numpy as np

from prelude.engine.output import FinishReason
from prelude.engine.work import Work

FOLD_EVERY_STEPS = 256  # bounds a histogram's pending values: a step observes at most a value per row

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
                   1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
# Token counts, as vLLM's 1-2-5 series (which it ends at --max-model-len; here at a million).
TOKEN_BUCKETS = tuple(float(m * 10**e) for e in range(6) for m in (1, 2, 5)) + (1e6,)


class Histogram:
    """A latency histogram as Prometheus exposes it: counts per bucket, their sum and count.

    `observe` is the bound `append` of a list of pending values, a C call without a Python frame
    (a request makes some eight observations, a streamed token one more); the values are counted into
    their buckets when the histogram is read, and by `fold`, which the engine's statistics call
    every FOLD_EVERY_STEPS steps to bound the list."""

    __slots__ = ("buckets", "_bounds", "_counts", "_total", "_count", "_pending", "observe")

    def __init__(self, buckets: tuple[float, ...] = LATENCY_BUCKETS):
        self.buckets = buckets
        self._bounds = np.array(buckets, dtype=np.float64)
        self._counts = np.zeros(len(buckets) + 1, dtype=np.int64)  # the last one: above every bound
        self._total = 0.0
        self._count = 0
        self._pending: list[float] = []
        self.observe: Callable[[float], None] = self._pending.append

    def fold(self) -> None:
        """Counts the pending values into their buckets, all at once: numpy's per-call cost
        over a fold's hundreds of values is a few instructions each, where a bisect and a
        Counter entry per value cost a request some 2,000 instructions per value it observed."""
        pending = self._pending
        if not pending:
            return
        values = np.array(pending, dtype=np.float64)
        # searchsorted left: a value equal to a bound counts in that bound's bucket (le).
        self._counts += np.bincount(np.searchsorted(self._bounds, values), minlength=len(self._counts))
        self._total += math.fsum(pending)
        self._count += len(pending)
        pending.clear()

    @property
    def counts(self) -> list[int]:
        """Observations per bucket (not cumulative), the last one above every bound."""
        self.fold()
        return self._counts.tolist()

    @property
    def total(self) -> float:
        self.fold()
        return self._total

    @property
    def count(self) -> int:
        self.fold()
        return self._count


@dataclass(slots=True)
class EngineStats:
    ttft: Histogram = field(default_factory=Histogram)
    e2e: Histogram = field(default_factory=Histogram)
    queue_time: Histogram = field(default_factory=Histogram)
    prefill_time: Histogram = field(default_factory=Histogram)
    decode_time: Histogram = field(default_factory=Histogram)  # first token to finish
    inference_time: Histogram = field(default_factory=Histogram)  # first scheduled to finish
    time_per_output_token: Histogram = field(default_factory=Histogram)  # a request's mean after its first
    inter_token: Histogram = field(default_factory=Histogram)  # each gap between a request's tokens
    step_time: Histogram = field(default_factory=Histogram)
    step_tokens: Histogram = field(default_factory=partial(Histogram, TOKEN_BUCKETS))  # prompt and decode tokens
    request_prompt_tokens: Histogram = field(default_factory=partial(Histogram, TOKEN_BUCKETS))
    request_generation_tokens: Histogram = field(default_factory=partial(Histogram, TOKEN_BUCKETS))
    prompt_tokens: int = 0
    generation_tokens: int = 0
    cached_tokens: int = 0
    arrived: int = 0
    finished: dict[str, int] = field(default_factory=dict)
    failed_steps: int = 0  # steps whose forward raised (their rows were then retried in halves)
    failed_requests: int = 0  # requests ended because their own row raised
    rejected: dict[str, int] = field(default_factory=dict)  # requests refused at admission, by reason
    steps: int = 0

    def on_arrival(self) -> None:
        self.arrived += 1

    def on_step(self, seconds: float, tokens: int) -> None:
        self.step_time.observe(seconds)
        self.step_tokens.observe(tokens)
        self.steps += 1
        if not self.steps % FOLD_EVERY_STEPS:
            for f in fields(self):
                value = getattr(self, f.name)
                if isinstance(value, Histogram):
                    value.fold()

    def on_first_token(self, work: Work, now: float) -> None:
        """The request's prompt is computed: its tokens count now (generated tokens count as each
        step delivers them), so the counters move while streams run and keep what aborted ones did."""
        request = work.request
        self.prompt_tokens += request.num_prompt_tokens
        self.cached_tokens += work.num_cached_tokens
        self.ttft.observe(now - request.arrival_time)
        if work.first_scheduled is not None:
            self.queue_time.observe(work.first_scheduled - request.arrival_time)
            self.prefill_time.observe(now - work.first_scheduled)

    def on_finish(self, work: Work, num_output_tokens: int, reason: FinishReason, now: float,
                  first_token_time: float | None = None) -> None:
        self.finished[reason.value] = self.finished.get(reason.value, 0) + 1
        if reason in (FinishReason.ABORT, FinishReason.ERROR):
            return
        request = work.request
        self.e2e.observe(now - request.arrival_time)
        if work.first_scheduled is not None:
            self.inference_time.observe(now - work.first_scheduled)
        self.request_prompt_tokens.observe(request.num_prompt_tokens)
        self.request_generation_tokens.observe(num_output_tokens)
        if first_token_time is not None:
            self.decode_time.observe(now - first_token_time)
            if num_output_tokens > 1:
                self.time_per_output_token.observe((now - first_token_time) / (num_output_tokens - 1))

    def on_rejected(self, reason: str) -> None:
        self.rejected[reason] = self.rejected.get(reason, 0) + 1

    def on_step_failure(self, num_failed_requests: int) -> None:
        self.failed_steps += 1
        self.failed_requests += num_failed_requests

