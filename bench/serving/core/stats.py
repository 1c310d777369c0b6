"""The pure arithmetic of a benchmark run: percentiles, latency summaries, Poisson arrival times,
and the per-run summary built from request records. No I/O, so it is unit-tested directly."""
from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass, field
from typing import Iterable, Sequence

PERCENTILES = (50, 95, 99)


def percentile(values: Sequence[float], p: float) -> float | None:
    """The p-th percentile with linear interpolation between closest ranks (numpy's default),
    so that P50 of an even-sized sample is the mean of the two middle values. None when empty."""
    if not 0 <= p <= 100:
        raise ValueError(f"percentile must be in [0, 100], got {p}")
    if not values:
        return None
    ordered = sorted(values)
    rank = p / 100 * (len(ordered) - 1)
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass(frozen=True, slots=True)
class Distribution:
    """Summary of one latency metric, in seconds (None where there was no sample)."""

    count: int = 0
    mean: float | None = None
    p50: float | None = None
    p95: float | None = None
    p99: float | None = None
    max: float | None = None

    @classmethod
    def of(cls, values: Sequence[float]) -> "Distribution":
        if not values:
            return cls()
        p50, p95, p99 = (percentile(values, p) for p in PERCENTILES)
        return cls(len(values), sum(values) / len(values), p50, p95, p99, max(values))


def poisson_arrivals(rate: float, rng: random.Random, count: int | None = None,
                     horizon: float | None = None) -> list[float]:
    """Send times (seconds from the start) of a Poisson process of `rate` requests per second:
    exponential gaps, so arrivals do not wait for completions (an open loop). Stops after
    `count` arrivals or at `horizon` seconds, whichever comes first; one of them is required so
    the schedule is finite."""
    if rate <= 0:
        raise ValueError(f"rate must be positive, got {rate}")
    if count is None and horizon is None:
        raise ValueError("give a count or a horizon")
    times: list[float] = []
    t = 0.0
    while count is None or len(times) < count:
        t += rng.expovariate(rate)
        if horizon is not None and t >= horizon:
            break
        times.append(t)
    return times


@dataclass(slots=True)
class RequestRecord:
    """One request as the client saw it. Times are time.perf_counter() seconds."""

    start: float
    end: float = 0.0
    ok: bool = False
    first_token: float | None = None  # first streamed chunk carrying a choice; None unstreamed
    prompt_tokens: int = 0  # from usage when the server reports it, else the planned count
    output_tokens: int = 0
    expected_output_tokens: int = 0
    error: str | None = None

    @property
    def e2e(self) -> float:
        return self.end - self.start

    @property
    def ttft(self) -> float:
        """Unstreamed requests have no earlier token event: their first token is their end."""
        return (self.first_token if self.first_token is not None else self.end) - self.start

    @property
    def tpot(self) -> float | None:
        """Mean time per output token after the first (vLLM's definition); None below 2 tokens."""
        if self.first_token is None or self.output_tokens < 2:
            return None
        return (self.end - self.first_token) / (self.output_tokens - 1)


@dataclass(slots=True)
class RunSummary:
    """Everything one table row and one JSON entry report about a measured run."""

    completed: int
    errors: int
    duration_s: float
    request_rate: float
    input_tok_per_s: float
    output_tok_per_s: float
    rpm: float
    streamed: bool  # False: 1-token requests sent unstreamed, so TTFT equals E2E
    ttft: Distribution
    tpot: Distribution
    e2e: Distribution
    output_len_mismatches: int  # completed requests whose usage differs from the requested length
    error_samples: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return asdict(self)


def summarize(records: Iterable[RequestRecord], streamed: bool) -> RunSummary:
    records = list(records)
    ok = [r for r in records if r.ok]
    failed = [r for r in records if not r.ok]
    # The window spans every request sent, failed ones included: they occupied the run too.
    duration = (max(r.end for r in records) - min(r.start for r in records)) if records else 0.0
    per_s = 1.0 / duration if duration > 0 else 0.0
    samples = list(dict.fromkeys(r.error or "unknown error" for r in failed))[:3]
    tpots = [t for t in (r.tpot for r in ok) if t is not None]
    return RunSummary(
        completed=len(ok),
        errors=len(failed),
        duration_s=duration,
        request_rate=len(ok) * per_s,
        input_tok_per_s=sum(r.prompt_tokens for r in ok) * per_s,
        output_tok_per_s=sum(r.output_tokens for r in ok) * per_s,
        rpm=len(ok) * per_s * 60,
        streamed=streamed,
        ttft=Distribution.of([r.ttft for r in ok]),
        tpot=Distribution.of(tpots),
        e2e=Distribution.of([r.e2e for r in ok]),
        output_len_mismatches=sum(1 for r in ok if r.expected_output_tokens
                                  and r.output_tokens != r.expected_output_tokens),
        error_samples=samples,
    )
