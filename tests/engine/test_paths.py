"""Greedy outputs are identical through the OneShot, Decode and Mixed paths, with and without
prefix-cache hits, chunked or not, and equal to plain full forwards of transformers' model."""
from __future__ import annotations

import asyncio

import pytest
import torch

from prelude.contract.config import Config
from prelude.app.assembly import build
from prelude.engine.request import Request
from prelude.contract.sampling import SamplingParams
from tests.checkpoints import load_reference

PROMPTS = [
    "The model answers yes or no to every question about the document.",
    "Judge: is this answer relevant? The document says the cache holds blocks",
    "Short",
    "The model answers yes or no to every question about the policy, twice.",
]


@pytest.fixture(scope="module")
def reference(demo_model):
    """The prompts' token ids and transformers' greedy 6-token continuation of each, computed
    once for all parametrizations."""
    from prelude.tokenizer import load

    model = load_reference(demo_model)
    tokenizer = load(demo_model, "hf")

    def greedy(prompt_ids: list[int], n: int) -> list[int]:
        ids = list(prompt_ids)
        with torch.no_grad():
            for _ in range(n):
                ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
        return ids[len(prompt_ids):]

    prompts = [tokenizer.encode(p) for p in PROMPTS]
    return prompts, {i: greedy(ids, 6) for i, ids in enumerate(prompts)}


def run(config: Config, jobs: list[tuple[list[int], int]], stagger: bool = False):
    """Submits (prompt ids, max_tokens) jobs to a fresh engine; returns outputs and the engine."""
    engine = build(config).engine

    async def main():
        await engine.start()
        try:
            streams = []
            for i, (ids, n) in enumerate(jobs):
                streams.append(engine.submit(Request(f"r{i}", ids, SamplingParams(max_tokens=n, temperature=0))))
                if stagger:
                    await asyncio.sleep(0.05)  # later prompts arrive while earlier ones decode
            return await asyncio.gather(*(s.collect() for s in streams))
        finally:
            await engine.stop()

    return asyncio.run(main()), engine


@pytest.mark.slow  # transformers' reference forwards, and the real model on four paths
@pytest.mark.parametrize("disable_oneshot", [False, True])
@pytest.mark.parametrize("prefix_caching", [True, False])
def test_greedy_tokens_match_full_forward_on_every_path(demo_model, reference, disable_oneshot, prefix_caching):
    prompts, expected = reference
    # One-token and six-token requests for every prompt, twice over (the second round hits the
    # prefix cache), with a small token budget so that long prompts are chunked beside decodes.
    jobs = [(ids, n) for _ in range(2) for ids in prompts for n in (1, 6)]
    config = Config(model=str(demo_model), device="cpu", block_size=4, max_num_batched_tokens=12,
                    enable_prefix_caching=prefix_caching, disable_oneshot=disable_oneshot)
    outputs, engine = run(config, jobs, stagger=True)
    for (ids, n), out in zip(jobs, outputs):
        assert out.token_ids == expected[prompts.index(ids)][:n]
    steps = engine.scheduler.stats.steps
    assert steps["mixed"] > 0 and steps["decode"] > 0
    assert (steps["oneshot"] > 0) == (not disable_oneshot)
    assert (engine.scheduler.pool.hit_tokens > 0) == prefix_caching
    engine.scheduler.pool.check_integrity()
    assert engine.scheduler.pool.num_used_blocks == 0
