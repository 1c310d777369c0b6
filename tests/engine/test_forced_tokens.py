"""Jump-forward decoding: where a grammar allows one continuation alone (a schema's keys, its
punctuation), the answer takes those tokens without sampling them, and a later step computes
them with the row that samples the token after them. Checked against transformers' full
forward over the finished answer: every sampled token is the greedy choice among the tokens
the grammar allows at its position (so the forced tokens' K/V, computed in a chunk beside
other rows, are the same as a full forward's)."""
from __future__ import annotations

import asyncio
import json

import pytest
import torch

from prelude.app.assembly import build
from prelude.contract.config import Config
from prelude.contract.sampling import SamplingParams
from prelude.engine.request import Request
from prelude.structured.compiler import Constraint, GrammarCompiler
from prelude.executor.sampler import unpack_bitmask
from tests.checkpoints import load_reference

SCHEMA = {"type": "object", "properties": {
    "the_verdict_of_this_judge": {"enum": ["accepted_without_any_change", "rejected_with_comments"]},
    "confidence_in_that_verdict": {"type": "integer", "minimum": 1, "maximum": 5}},
    "required": ["the_verdict_of_this_judge", "confidence_in_that_verdict"], "additionalProperties": False}
PROMPTS = ["Judge the answer:", "Is the document relevant to the question? Say so.", "Verdict"]


@pytest.mark.slow  # transformers' reference forwards
def test_forced_tokens_are_taken_unsampled_and_computed_as_a_full_forward_would(demo_model):
    built = build(Config(model=str(demo_model), device="cpu", block_size=4, max_num_batched_tokens=64))
    engine, tokenizer = built.engine, built.served.tokenizer
    vocab = built.served.config.vocab_size
    compiler = GrammarCompiler(demo_model / "tokenizer.json", vocab, built.served.eos_token_ids)
    grammar = compiler.compile(Constraint.json_schema(SCHEMA, "structured_outputs"))
    prompts = [tokenizer.encode(p) for p in PROMPTS]

    async def main():
        await engine.start()
        try:
            streams = [engine.submit(Request(f"r{i}", ids, SamplingParams(max_tokens=80, temperature=0),
                                             grammar=grammar.new_state()))
                       for i, ids in enumerate(prompts)]  # together: forced chunks run beside decodes
            return await asyncio.gather(*(s.collect() for s in streams))
        finally:
            await engine.stop()

    outputs = asyncio.run(main())
    stats = engine.scheduler.stats
    model = load_reference(demo_model)
    for ids, out in zip(prompts, outputs):
        assert out.finish_reason == "stop"
        json.loads(tokenizer.decode(out.token_ids[:-1]))
        with torch.no_grad():
            logits = model(torch.tensor([ids + out.token_ids[:-1]])).logits[0, len(ids) - 1:]
        state, at, sampled = grammar.new_state(), 0, 0
        while at < len(out.token_ids):
            words = torch.frombuffer(bytearray(state.matcher.compute_bitmask()), dtype=torch.int32)
            allowed = unpack_bitmask(words[None], vocab)[0]
            assert out.token_ids[at] == int(logits[at].masked_fill(~allowed, float("-inf")).argmax()), at
            forced = state.forced_after(at, out.token_ids[at], 80)
            assert list(forced) == out.token_ids[at + 1:at + 1 + len(forced)]
            at, sampled = at + 1 + len(forced), sampled + 1
        assert sampled < len(out.token_ids) - 10  # the keys and punctuation were not sampled
    assert stats.prefill_tokens > sum(map(len, prompts)) + 10  # forced tokens are computed in chunks
    engine.scheduler.pool.check_integrity()
    assert engine.scheduler.pool.num_used_blocks == 0

