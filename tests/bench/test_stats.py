"""The benchmark's arithmetic: percentiles, Poisson arrivals, run summaries."""
from __future__ import annotations

import random
import statistics

import pytest

from bench.serving.core.stats import Distribution, RequestRecord, percentile, poisson_arrivals, summarize


def test_percentile_interpolates_between_closest_ranks():
    values = [4.0, 1.0, 3.0, 2.0]  # unsorted on purpose
    assert percentile(values, 0) == 1.0
    assert percentile(values, 100) == 4.0
    assert percentile(values, 50) == 2.5  # mean of the two middle values
    assert percentile(values, 25) == pytest.approx(1.75)
    assert percentile(list(range(101)), 99) == pytest.approx(99.0)
    assert percentile([7.0], 95) == 7.0
    assert percentile([], 50) is None


def test_percentile_matches_the_statistics_module():
    rng = random.Random(3)
    values = [rng.expovariate(1.0) for _ in range(501)]
    assert percentile(values, 50) == pytest.approx(statistics.median(values))
    # statistics.quantiles' "inclusive" method is the same linear interpolation.
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    assert percentile(values, 95) == pytest.approx(cuts[94])
    assert percentile(values, 99) == pytest.approx(cuts[98])


def test_percentile_rejects_out_of_range():
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_distribution_of_samples_and_of_nothing():
    d = Distribution.of([0.1, 0.2, 0.3])
    assert d.count == 3 and d.mean == pytest.approx(0.2) and d.p50 == pytest.approx(0.2) and d.max == 0.3
    assert Distribution.of([]) == Distribution()


def test_poisson_arrivals_have_the_requested_rate():
    times = poisson_arrivals(20.0, random.Random(1), count=20000)
    assert len(times) == 20000
    assert all(b > a for a, b in zip(times, times[1:]))
    gaps = [b - a for a, b in zip([0.0] + times, times)]
    assert statistics.mean(gaps) == pytest.approx(1 / 20, rel=0.03)
    # Exponential gaps: standard deviation equals the mean (a fixed-interval schedule would give 0).
    assert statistics.pstdev(gaps) == pytest.approx(1 / 20, rel=0.05)


def test_poisson_arrivals_stop_at_count_or_horizon_and_are_seeded():
    assert len(poisson_arrivals(100.0, random.Random(0), count=5, horizon=100.0)) == 5
    within = poisson_arrivals(100.0, random.Random(0), horizon=2.0)
    assert within and max(within) < 2.0 and 150 < len(within) < 250
    assert poisson_arrivals(5.0, random.Random(9), count=10) == poisson_arrivals(5.0, random.Random(9), count=10)
    with pytest.raises(ValueError):
        poisson_arrivals(0.0, random.Random(0), count=1)
    with pytest.raises(ValueError):
        poisson_arrivals(1.0, random.Random(0))


def test_record_latencies():
    streamed = RequestRecord(start=10.0, end=10.5, ok=True, first_token=10.1, output_tokens=5)
    assert streamed.ttft == pytest.approx(0.1) and streamed.e2e == pytest.approx(0.5)
    assert streamed.tpot == pytest.approx(0.4 / 4)
    unstreamed = RequestRecord(start=1.0, end=1.25, ok=True, output_tokens=1)
    assert unstreamed.ttft == unstreamed.e2e == 0.25 and unstreamed.tpot is None


def test_summary_counts_throughput_over_the_whole_window():
    records = [
        RequestRecord(start=0.0, end=1.0, ok=True, first_token=0.2, prompt_tokens=100, output_tokens=9,
                      expected_output_tokens=9),
        RequestRecord(start=0.5, end=2.0, ok=True, first_token=0.7, prompt_tokens=100, output_tokens=8,
                      expected_output_tokens=9),
        RequestRecord(start=1.0, end=1.5, ok=False, error="HTTP 500: boom"),
    ]
    s = summarize(records, streamed=True)
    assert (s.completed, s.errors, s.duration_s) == (2, 1, 2.0)
    assert s.request_rate == pytest.approx(1.0) and s.rpm == pytest.approx(60.0)
    assert s.input_tok_per_s == pytest.approx(100.0) and s.output_tok_per_s == pytest.approx(8.5)
    assert s.ttft.mean == pytest.approx(0.2) and s.e2e.max == pytest.approx(1.5)
    assert s.output_len_mismatches == 1 and s.error_samples == ["HTTP 500: boom"]
    assert summarize([], streamed=False).completed == 0
