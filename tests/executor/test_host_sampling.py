"""The CPU runner's draws without torch (executor.host_sampling) restrict a row exactly as the
torch sampler does (the same float32 values after allowed ids, a logit bias, min_tokens and
each penalty), and draw the same tokens with the same logprobs on the same rows and seeds, under
a grammar's mask too."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from prelude.contract.sampling import SamplingParams
from prelude.executor import host_sampling, native_heads
from prelude.executor.sampler import RowMasks, restrict_logits, sample
from prelude.structured.masks import StepMasks

VOCAB = 1000
HISTORY = [5, 17, 17, 900, 3, 17, 42, 5, 640]  # the prompt's first six, then three generated
STEP = 3

RESTRICTIONS = [
    SamplingParams(temperature=1.0, allowed_token_ids=(3, 17, 640, 999)),
    SamplingParams(temperature=1.0, logit_bias=((7, 4.5), (900, -100.0), (7, 1.0))),  # a repeated id: the last
    SamplingParams(temperature=1.0, min_tokens=5, min_tokens_blocked=(0, 17)),
    SamplingParams(temperature=1.0, min_tokens=2, min_tokens_blocked=(0, 17)),  # past min_tokens: no block
    SamplingParams(temperature=1.0, repetition_penalty=1.7),
    SamplingParams(temperature=1.0, frequency_penalty=0.7, presence_penalty=-0.3),
    SamplingParams(temperature=1.0, repetition_penalty=0.8, frequency_penalty=1.1, presence_penalty=0.6,
                   logit_bias=((42, 2.0),), allowed_token_ids=tuple(range(0, 1000, 3))),
]


def _rows(n: int, seed: int) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal((n, VOCAB)) * 3).astype(np.float32)


@pytest.mark.parametrize("params", RESTRICTIONS, ids=["allowed", "bias", "min-tokens", "past-min-tokens",
                                                      "repetition", "frequency-presence", "all"])
def test_a_restricted_row_holds_torchs_values(params):
    logits = _rows(1, 3)
    expected = torch.from_numpy(logits.copy())
    restrict_logits(expected, [params], [STEP], [HISTORY])
    host_sampling.restrict(logits[0], params, STEP, HISTORY)
    np.testing.assert_array_equal(logits, expected.numpy())


def test_draws_are_the_torch_samplers_on_the_same_rows_and_seeds():
    if native_heads.sample_tokens is None:
        pytest.skip("kernels.cpu is not built")

    class Row:
        sample_step, history = STEP, HISTORY

    params = [SamplingParams(**{**{f: getattr(p, f) for f in ("temperature", "allowed_token_ids", "logit_bias",
                                                              "min_tokens", "min_tokens_blocked", "repetition_penalty",
                                                              "frequency_penalty", "presence_penalty")},
                                "seed": 100 + k, "top_k": 50, "logprobs": None if p.allowed_token_ids else 2})
              for k, p in enumerate(RESTRICTIONS)]
    params.append(SamplingParams(temperature=0.0, logit_bias=((11, 50.0),), logprobs=1))  # greedy, restricted
    for seed in range(5):
        logits = _rows(len(params), seed)
        expected = sample(torch.from_numpy(logits.copy()), params, [STEP] * len(params), [HISTORY] * len(params))
        got = host_sampling.sample(logits.copy(), params, lambda k: Row, np.random.default_rng(0), 1)
        assert [t.token_id for t in got] == [t.token_id for t in expected]
        assert got[-1].token_id == 11
        for g, e in zip(got, expected):
            assert g.logprob == pytest.approx(e.logprob, abs=1e-5) and g.rank == e.rank
            assert [t for t, _ in g.top] == [t for t, _ in e.top]


def test_a_grammar_and_allowed_ids_report_as_the_torch_sampler_does():
    """Rows under a grammar's mask, one also restricted to allowed ids that report logprobs: the
    same tokens and logprobs as the torch sampler, the allowed alternatives' values too, and a
    row whose grammar forbids every allowed id lists them at -inf (not NaN)."""
    if native_heads.mask_logits is None:
        pytest.skip("kernels.cpu is not built")

    class Row:
        sample_step, history = 0, ()

        def __init__(self, seq_id: int):
            self.seq_id = seq_id

    allowed_by_grammar = [list(range(0, VOCAB, 7)), list(range(1, 40))]  # the second: not token 0, argmax of -infs
    bitmask = np.zeros((2, (VOCAB + 31) // 32), np.int32)
    for r, ids in enumerate(allowed_by_grammar):
        bits = np.zeros(bitmask.shape[1] * 32, np.uint8)
        bits[ids] = 1
        bitmask[r] = np.packbits(bits, bitorder="little").view(np.int32)
    masks = StepMasks(bitmask, {10: 0, 11: 1})  # seq 12 has no grammar
    params = [SamplingParams(temperature=0.0, logprobs=3, allowed_token_ids=(7, 14, 21, 22)),
              SamplingParams(temperature=0.0, logprobs=2, allowed_token_ids=(50, 60)),  # the grammar forbids both
              SamplingParams(temperature=1.0, seed=9, logprobs=2)]
    logits = _rows(3, 7)
    got = host_sampling.sample(logits.copy(), params, lambda k: Row(10 + k), np.random.default_rng(0), 1, masks)
    expected = sample(torch.from_numpy(logits.copy()), params, [0] * 3,
                      masks=RowMasks(torch.from_numpy(bitmask), [0, 1]))
    for g, e in zip(got, expected):
        assert g.token_id == e.token_id and g.rank == e.rank
        assert g.logprob == pytest.approx(e.logprob, abs=1e-5)
        assert [t for t, _ in g.top] == [t for t, _ in e.top]
        assert [v for _, v in g.top] == pytest.approx([v for _, v in e.top], abs=1e-5)
    assert got[0].token_id in (7, 14, 21) and got[0].top[0] == (got[0].token_id, got[0].logprob)
    assert [v for _, v in got[1].top] == [-np.inf, -np.inf]
