"""bench.serving.shared_prefix's workload: distinct system prompts of at least the asked length,
and a request plan that is Zipf-skewed and the same for every policy (same seed)."""
from __future__ import annotations

from collections import Counter

from bench.serving.shared_prefix import plan_requests, system_prompts


def test_system_prompts_are_long_enough_and_distinct_from_the_first_word():
    texts = system_prompts(4, 300, lambda text: len(text.split()), seed=1)
    assert all(len(t.split()) >= 300 for t in texts)
    assert len({t.split(":")[0] for t in texts}) == 4


def test_the_plan_is_skewed_and_repeatable():
    plan = plan_requests(2000, 8, 1.0, seed=3)
    assert plan == plan_requests(2000, 8, 1.0, seed=3)
    counts = Counter(k for k, _ in plan)
    assert counts[0] > 2 * counts[3] > 0 and len({q for _, q in plan}) == 2000
