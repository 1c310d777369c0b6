"""Under KV pressure, concurrent greedy generations are preempted for recompute again and again
beside scoring and embedding requests; every answer, logprobs included, equals the one the same
request gets alone, and the pool ends idle (no block leaks), with and without prefix caching."""
from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from prelude.contract.config import Config
from tests.server.harness import ServerThread


def _jobs(seed: int = 5) -> list[tuple[str, dict]]:
    rng = random.Random(seed)
    shared = [rng.randrange(3, 500) for _ in range(24)]  # a prefix some prompts share
    jobs = []
    for i in range(30):
        prompt = (shared if i % 3 == 0 else []) + [rng.randrange(3, 500) for _ in range(rng.randrange(2, 30))]
        if i % 5 == 4:
            jobs.append(("/v1/score", {"query": prompt, "items": [[7, 8, 9], [10, 11]], "label_token_ids": [5, 9]}))
        elif i % 7 == 6:
            jobs.append(("/v1/embeddings", {"input": [prompt]}))
        else:
            jobs.append(("/v1/completions", {"prompt": prompt, "max_tokens": rng.randrange(8, 48), "temperature": 0,
                                             "ignore_eos": True, "logprobs": 2, "n": 1 + (i % 4 == 1)}))
    return jobs


def _answer(url: str, job: tuple[str, dict]):
    path, body = job
    response = httpx.post(url + path, json=body, timeout=120)
    assert response.status_code == 200, response.text
    data = response.json()
    if path == "/v1/completions":
        return [(c["text"], c["logprobs"]["token_logprobs"]) for c in data["choices"]]
    if path == "/v1/score":
        return data["scores"]
    return data["data"][0]["embedding"]


def _close(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return abs(a - b) <= 1e-4 * max(1.0, abs(b))
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    return a == b


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_answers_under_repeated_preemption_equal_answers_alone(demo_model, prefix_caching):
    # 40 blocks of 4 hold about two of these sequences at their longest, and steps of 64 tokens
    # make prompts come in chunks beside the decodes.
    config = Config(model=str(demo_model), block_size=4, num_kv_blocks=40, max_num_batched_tokens=64,
                    max_num_seqs=8, enable_prefix_caching=prefix_caching)
    jobs = _jobs()
    with ServerThread(config) as srv:
        with ThreadPoolExecutor(12) as pool:
            together = list(pool.map(lambda job: _answer(srv.base_url, job), jobs))
        assert srv.engine.snapshot().scheduler.num_preemptions > 0
        alone = [_answer(srv.base_url, job) for job in jobs]
        srv.wait_idle()
    for job, got, want in zip(jobs, together, alone):
        assert _close(got, want), (job, got, want)
