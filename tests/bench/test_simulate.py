"""bench.sim.simulate: deterministic with a seed, every request completes once, and on the
shared-prefix workload the prefix-aware policies beat round_robin on hit rate and mean TTFT."""
from __future__ import annotations

import json

from bench.sim.simulate import main, simulate

SETUP = dict(prompts=8, requests=300, clients=8)  # the 2-replica bench's defaults


def test_a_seed_gives_the_same_run():
    a = simulate("e2", 2, seed=3, **SETUP)
    assert a == simulate("e2", 2, seed=3, **SETUP)
    assert a != simulate("e2", 2, seed=4, **SETUP)


def test_every_request_completes_exactly_once():
    for policy in ("round_robin", "cache_aware", "e2"):
        for replicas, scale in ((2, 1), (8, 4)):
            r = simulate(policy, replicas, prompts=8 * scale, requests=300 * scale, clients=8 * scale)
            assert r["ids"] == list(range(300 * scale)) and sum(r["per_replica"]) == 300 * scale


def test_prefix_aware_policies_hit_more_and_wait_less_than_round_robin():
    runs = {p: simulate(p, 2, **SETUP) for p in ("round_robin", "cache_aware", "e2")}
    assert runs["cache_aware"]["hit_rate"] >= runs["round_robin"]["hit_rate"]
    assert runs["e2"]["ttft_mean_ms"] <= runs["round_robin"]["ttft_mean_ms"]
    assert 0.7 < runs["round_robin"]["hit_rate"] < 0.85 < 0.9 < runs["cache_aware"]["hit_rate"] < 0.97


def test_the_cli_prints_the_table_and_the_check(tmp_path, capsys):
    assert main(["--replicas", "2,4", "--json", str(tmp_path / "s.json")]) == 0
    out = capsys.readouterr().out
    assert "Check against the 2-replica bench" in out and "round_robin" in out
    data = json.loads((tmp_path / "s.json").read_text())
    assert len(data["results"]) == 6 and len(data["check"]) == 4


def test_e2_replicates_a_hot_prompt_over_several_replicas():
    hot = dict(prompts=1, requests=400, clients=32)  # every request shares one system prompt
    spread = simulate("e2", 16, **hot)
    assert sum(n > 0 for n in spread["per_replica"]) > 1
    pinned = simulate("e2", 16, replicate=float("inf"), **hot)  # no replication: one replica serves all
    assert sum(n > 0 for n in pinned["per_replica"]) == 1
    assert spread["req_per_s"] > 2 * pinned["req_per_s"]


def test_e2_is_at_least_as_good_as_round_robin_at_scale():
    for replicas in (8, 32):
        f = replicas // 2
        runs = {p: simulate(p, replicas, prompts=8 * f, requests=300 * f, clients=8 * f) for p in ("round_robin", "e2")}
        assert runs["e2"]["ttft_mean_ms"] < runs["round_robin"]["ttft_mean_ms"]
        assert runs["e2"]["req_per_s"] > runs["round_robin"]["req_per_s"]
