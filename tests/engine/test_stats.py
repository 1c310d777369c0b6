"""The engine's latency histograms: what /metrics reads of them, whenever their values are counted."""
from prelude.engine.stats import FOLD_EVERY_STEPS, LATENCY_BUCKETS, EngineStats, Histogram


def test_a_histogram_counts_each_value_in_its_bucket_once():
    hist = Histogram()
    values = [0.0005, 0.001, 0.0011, 0.3, 0.3, 95.0]
    for v in values[:3]:
        hist.observe(v)
    assert hist.count == 3  # read between observations: the first three are counted once
    for v in values[3:]:
        hist.observe(v)
    expected = [0] * (len(LATENCY_BUCKETS) + 1)
    for v in values:  # Prometheus' le: a value equal to a bound belongs to that bound's bucket
        expected[next((i for i, b in enumerate(LATENCY_BUCKETS) if v <= b), len(LATENCY_BUCKETS))] += 1
    assert hist.counts == expected
    assert hist.count == len(values)
    assert abs(hist.total - sum(values)) < 1e-9


def test_the_engine_counts_pending_values_as_steps_go_by():
    stats = EngineStats()
    for _ in range(FOLD_EVERY_STEPS * 2 + 1):
        stats.on_step(0.002, 16)
    assert len(stats.step_time._pending) == 1  # the pending list is bounded: counted every FOLD_EVERY_STEPS steps
    assert stats.step_time.count == FOLD_EVERY_STEPS * 2 + 1
    assert stats.step_time.counts[LATENCY_BUCKETS.index(0.0025)] == FOLD_EVERY_STEPS * 2 + 1
