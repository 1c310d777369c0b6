"""Sampling draws from exactly the distribution its options define (chi-square over many draws
on a small vocabulary), seeded rows are reproducible whatever they are batched with, and greedy
rows are untouched."""
from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from prelude.contract.sampling import SamplingParams, seeded_uniform
from prelude.executor import sampler
from prelude.executor.sampler import sample

LOGITS = torch.tensor([2.0, 1.0, 0.5, 0.0, -0.5, -1.0, -2.0, -4.0])
DRAWS = 40_000
# Chi-square critical values at p = 0.001 by degrees of freedom: a correct sampler fails one
# case in a thousand, a wrong one (even a few percent off on one token) fails every time.
CRITICAL = {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47, 5: 20.52, 6: 22.46, 7: 24.32}


def expected(params: SamplingParams) -> torch.Tensor:
    """The distribution the options define, computed directly (float64)."""
    logits = LOGITS.double().clone()
    if params.allowed_token_ids is not None:
        mask = torch.full_like(logits, float("-inf"))
        mask[list(params.allowed_token_ids)] = 0.0
        logits = logits + mask
    for token, bias in params.logit_bias:
        logits[token] += bias
    logits = logits / params.temperature
    if params.min_p > 0:
        probs = logits.softmax(-1)
        logits[probs < params.min_p * probs.max()] = float("-inf")
    if params.top_k > 0:
        logits[logits < logits.topk(params.top_k).values[-1]] = float("-inf")
    probs = logits.softmax(-1)
    if params.top_p < 1.0:
        order = probs.argsort(descending=True)
        before = probs[order].cumsum(0) - probs[order]
        probs[order[before >= params.top_p]] = 0.0
        probs = probs / probs.sum()
    return probs


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.5),
    SamplingParams(temperature=2.0, top_k=3),
    SamplingParams(temperature=1.0, top_p=0.8),
    SamplingParams(temperature=0.7, top_k=5, top_p=0.9),
    SamplingParams(temperature=1.0, logit_bias=((7, 5.0),), allowed_token_ids=(0, 3, 7)),
    SamplingParams(temperature=1.5, min_p=0.1),
    SamplingParams(temperature=1.0, min_p=0.05, top_p=0.9),
], ids=["t1", "t0.5", "t2-k3", "p0.8", "t0.7-k5-p0.9", "bias-allowed", "t1.5-minp0.1", "minp0.05-p0.9"])
@pytest.mark.parametrize("kernel", ["native", "torch"])
def test_draws_follow_the_distribution(params, kernel, monkeypatch):
    """Both the native draw (fp32 on the CPU, its cuts included) and the torch one (CUDA's)."""
    if kernel == "torch":
        monkeypatch.setattr(sampler, "sample_tokens", None)
    elif sampler.sample_tokens is None:
        pytest.skip("kernels.cpu is not built")
    torch.manual_seed(1234)
    tokens = [t.token_id for t in sample(LOGITS.repeat(DRAWS, 1), [params] * DRAWS, [0] * DRAWS)]
    counts = torch.bincount(torch.tensor(tokens), minlength=len(LOGITS)).double()
    want = expected(params) * DRAWS
    assert counts[want == 0].sum() == 0, "a filtered-out token was drawn"
    support = want > 0
    chi2 = float((((counts - want)[support]) ** 2 / want[support]).sum())
    assert chi2 < CRITICAL[int(support.sum()) - 1], (chi2, counts.tolist(), want.tolist())


def test_seeded_rows_reproduce_whatever_their_batch():
    seeded = SamplingParams(temperature=1.0, seed=42)
    other = SamplingParams(temperature=1.3, top_k=4)
    alone = [sample(LOGITS[None].clone(), [seeded], [step])[0].token_id for step in range(20)]
    batched = [sample(LOGITS.repeat(3, 1), [other, seeded, other], [5, step, 9])[1].token_id for step in range(20)]
    assert alone == batched
    assert len(set(alone)) > 1  # the step index moves the draw: not one token forever


def test_greedy_rows_take_the_argmax_beside_sampled_rows():
    greedy, hot = SamplingParams(temperature=0.0), SamplingParams(temperature=5.0)
    tokens = sample(LOGITS.repeat(4, 1), [hot, greedy, hot, greedy], [0, 0, 0, 0])
    assert tokens[1].token_id == tokens[3].token_id == 0


def greedy_cases() -> list[torch.Tensor]:
    """Rows where an argmax can go wrong: ties, NaN, all -inf, +-0, +inf, the maximum in a
    tail shorter than a vector, rows of a wider tensor, a real vocabulary."""
    gen = torch.Generator().manual_seed(3)
    cases = [torch.randn(3, v, generator=gen) for v in (1, 7, 8, 9, 100, 151_936)]
    edge = torch.randn(6, 1000, generator=gen)
    edge[0, 500] = edge[0, 700] = float("nan")  # the first NaN, as torch answers
    edge[1] = float("-inf")
    edge[2, 3] = edge[2, 999] = 9.0  # a tie: the first
    edge[3] = 0.0
    edge[3, 0] = -0.0  # equal to 0.0: the first
    edge[4, 17] = float("inf")
    edge[5, 998:] = 50.0  # in the tail past the last whole vector
    cases.append(edge)
    cases.append(torch.randn(5, 1003, generator=gen)[:, :1000])  # rows 1003 floats apart
    return cases


def test_greedy_rows_are_torchs_argmax_on_rows_that_could_trip_a_vector_loop():
    if sampler.greedy_tokens is None:
        pytest.skip("kernels.cpu is not built")
    greedy = SamplingParams(temperature=0.0)
    for logits in greedy_cases():
        want = logits.argmax(dim=-1).tolist()
        assert [t.token_id for t in sample(logits, [greedy] * len(logits), [0] * len(logits))] == want


def test_tail_tokens_keep_their_share_on_a_real_vocabulary():
    """151,936 entries, the cumulative sum taken in float64: ten tail tokens holding 10% of the
    mass together are drawn at that rate."""
    vocab = 151_936
    logits = torch.full((vocab,), -math.inf)
    logits[0] = 0.0
    logits[vocab - 10:] = math.log(1 / 90)  # 10 x (1/90) against 1: 10% of the mass
    torch.manual_seed(7)
    batch, batches = 200, 5
    hits = 0
    for _ in range(batches):
        tokens = [t.token_id for t in sample(logits.repeat(batch, 1), [SamplingParams()] * batch, [0] * batch)]
        hits += sum(t >= vocab - 10 for t in tokens)
    share = hits / (batch * batches)
    assert 0.07 < share < 0.13, share  # 0.10 expected; +-3 binomial standard deviations


CUTS = [SamplingParams(temperature=0.6, top_p=0.95, top_k=20, seed=1),  # Qwen3's generation_config.json
        SamplingParams(temperature=1.0, top_p=0.8, seed=2),
        SamplingParams(temperature=1.3, top_k=50, seed=3),
        SamplingParams(temperature=0.9, min_p=0.05, seed=4),
        SamplingParams(temperature=1.1, min_p=0.02, top_k=200, top_p=0.7, seed=5),
        SamplingParams(temperature=2.0, top_k=5000, seed=6),
        SamplingParams(temperature=0.05, top_p=0.01, seed=7)]  # keeps the best token alone


def test_native_cuts_draw_the_tokens_torchs_draw(monkeypatch):
    """The native kernel's min-p, top-k and top-p (fp32, no sort of the vocabulary) against the
    torch path (which CUDA runs) on the same rows and the same seeded uniforms: the same tokens,
    over a real vocabulary's width and rows with ties, masked tokens and a single finite logit.
    Where tied tokens straddle top-p's boundary torch's sort keeps an arbitrary few of them and
    the kernel keeps them all (as both do at top-k's), so those rows are compared without top-p."""
    if sampler.sample_tokens is None:
        pytest.skip("kernels.cpu is not built")
    gen = torch.Generator().manual_seed(11)
    rows = torch.randn(8, 151_936, generator=gen) * 4
    rows[1, :5000] = float("-inf")  # masked tokens, as a grammar or allowed ids leave them
    best = int(rows[2].argmax())
    rows[2, 100:130] = float(rows[2, best])  # thirty-one ties at the top: top_k 20 keeps all of them
    rows[3] = float("-inf")
    rows[3, 77] = 0.0  # one finite logit: every cut keeps it
    rows[4] = 1.0  # all equal: one band holds every token
    for params in CUTS:
        for step in range(6):
            batch = [replace(params, seed=params.seed + 10 * r) for r in range(len(rows))]
            native = [t.token_id for t in sample(rows.clone(), batch, [step] * len(rows))]
            monkeypatch.setattr(sampler, "sample_tokens", None)
            reference = [t.token_id for t in sample(rows.clone(), batch, [step] * len(rows))]
            monkeypatch.undo()
            compared = range(len(rows)) if params.top_p >= 1.0 else [0, 1, 3, 5, 6, 7]
            assert [native[r] for r in compared] == [reference[r] for r in compared], (params, step)
            assert native[3] == 77
    tied = [sample(rows[2:3].clone(), [SamplingParams(top_k=20, seed=seed)], [0])[0].token_id for seed in range(300)]
    assert set(tied) == {best, *range(100, 130)}  # every one of those tied at the top, none else


def test_the_seeded_draw_depends_on_the_seed_and_the_step_alone():
    """Any integer seed (negative and past 64 bits too) gives a uniform in [0, 1) of its own."""
    seen = {seeded_uniform(seed, step) for seed in (0, 1, -1, 2**70, 12345) for step in range(50)}
    assert len(seen) == 250 and all(0.0 <= u < 1.0 for u in seen)
    assert seeded_uniform(42, 3) == seeded_uniform(42, 3)


def test_a_tokens_rank_counts_the_tokens_tied_with_it_as_vllm_does():
    """rank = how many tokens have at least its logprob, as vLLM 0.32 counts them (its sampler's
    `logprobs >= token's`): tied tokens share the worse rank. It counted strictly better + 1."""
    logprobs = torch.log_softmax(torch.tensor([3.0, 1.0, 1.0, 0.0]), dim=-1)
    assert sampler.token_logprob(logprobs, 0, 2).rank == 1
    assert sampler.token_logprob(logprobs, 1, 2).rank == 3 and sampler.token_logprob(logprobs, 2, 2).rank == 3
    assert sampler.token_logprob(logprobs, 3, 2).rank == 4


def test_grammar_masks_only_their_rows():
    """Rows with a grammar mask sample among its tokens, and report the constrained
    distribution's logprobs; the unconstrained rows beside them are untouched."""
    from prelude.executor.sampler import RowMasks

    logits = torch.stack([LOGITS, LOGITS, LOGITS])
    bitmask = torch.tensor([[0b0101_0000]], dtype=torch.int32)  # tokens 4 and 6
    greedy = SamplingParams(temperature=0.0, logprobs=2)
    out = sample(logits.clone(), [greedy, greedy, SamplingParams(temperature=1.0, seed=3)], [0, 0, 0],
                 masks=RowMasks(bitmask, [1]))
    assert out[0].token_id == 0 and out[1].token_id == 4
    expected = torch.log_softmax(LOGITS[[4, 6]], dim=-1)
    assert out[1].logprob == pytest.approx(float(expected[0]))
    assert [t for t, _ in out[1].top] == [4, 6]  # forbidden tokens are no alternatives
    unconstrained = sample(logits.clone(), [greedy, SamplingParams(temperature=1.0, seed=3)], [0, 0])
    assert out[2].token_id == unconstrained[1].token_id and out[0] == unconstrained[0]


def test_rows_restricted_to_allowed_tokens_report_the_whole_vocabulary_beside_plain_rows():
    """A row restricted to allowed_token_ids reports its token's logprob over the whole
    vocabulary and the best allowed tokens as alternatives; the plain rows beside it report
    their own top alternatives, each as many as it asked for."""
    logits = torch.stack([LOGITS, LOGITS.flip(0), LOGITS])
    params = [SamplingParams(temperature=0.0, logprobs=3),
              SamplingParams(temperature=0.0, logprobs=2, allowed_token_ids=(2, 5, 6)),
              SamplingParams(temperature=0.0, logprobs=1)]
    out = sample(logits.clone(), params, [0, 0, 0])
    whole = torch.log_softmax(logits, dim=-1)
    assert [e.token_id for e in out] == [0, 6, 0]
    assert out[1] == sampler.token_logprob(whole[1], 6, 2, (2, 5, 6))
    assert [t for t, _ in out[1].top] == [6, 5]
    for r, top in ((0, 3), (2, 1)):
        assert out[r].logprob == pytest.approx(float(whole[r, 0]))
        assert [t for t, _ in out[r].top] == whole[r].topk(top).indices.tolist()


def test_native_logprobs_agree_with_torchs_log_softmax_rank_and_topk(monkeypatch):
    """The native kernel (fp32 on the CPU) against the torch path on the same rows: the same
    ranks and the same alternatives (of tied ones, the lower id first), and logprobs within float
    rounding of float64's. (Not of torch's float32 log_softmax: over a 152K vocabulary its float
    sum drifts by 1e-5 where torch runs its baseline kernels, as on AMD CPUs capped to them.)"""
    if sampler.native_logprobs is None:
        pytest.skip("kernels.cpu is not built")
    gen = torch.Generator().manual_seed(5)
    rows = [torch.randn(4, v, generator=gen) * 3 for v in (5, 8, 13, 1000, 151_936)]
    edge = torch.randn(3, 300, generator=gen)
    edge[0, 10:20] = float("-inf")  # masked tokens: no mass, never an alternative
    edge[1, :] = float("-inf")
    edge[1, [3, 250]] = torch.tensor([1.0, 2.0])  # two finite logits: fewer alternatives than asked
    edge[2, [7, 8, 9]] = 4.0  # three tied: the rank counts them all
    rows.append(edge)
    rows.append(torch.randn(3, 1007, generator=gen)[:, :1000])  # rows 1007 floats apart
    for logits in rows:
        targets = [int(t) for t in torch.randint(0, logits.shape[1], (len(logits),), generator=gen)]
        if logits is edge:
            targets = [0, 3, 8]
        native = sampler.token_logprobs(logits, targets, 5)
        monkeypatch.setattr(sampler, "native_logprobs", None)
        reference = sampler.token_logprobs(logits, targets, 5)
        monkeypatch.undo()
        exact = torch.log_softmax(logits.double(), dim=-1)
        for row, got, want in zip(exact, native, reference):
            assert got.token_id == want.token_id and got.rank == want.rank
            assert got.logprob == pytest.approx(float(row[got.token_id]), abs=1e-5)
            in_order = sorted(want.top, key=lambda entry: (-entry[1], entry[0]))  # torch orders ties as it likes
            assert [t for t, _ in got.top] == [t for t, _ in in_order]
            assert [v for _, v in got.top] == pytest.approx([float(row[t]) for t, _ in got.top], abs=1e-5)
    assert native[1].top and len(sampler.token_logprobs(edge, [3, 3, 3], 5)[1].top) == 2


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU"))])
def test_the_device_path_draws_the_native_kernels_tokens(device, monkeypatch):
    """The path CUDA runs (torch's cuts, the grammar bitmask unpacked by tensor ops; on "cpu"
    the same ops with the native kernels switched off) against the CPU's native kernels on the
    same rows, seeds and masks (numpy bitmasks, as structured.masks fills them): the same tokens
    and logprobs, the masked rows' among the tokens their masks allow."""
    import numpy as np

    from prelude.executor.sampler import RowMasks

    if sampler.sample_tokens is None:
        pytest.skip("kernels.cpu is not built")
    gen = torch.Generator().manual_seed(5)
    rows = torch.randn(6, 151_936, generator=gen) * 4
    allowed = [list(range(0, 151_936, 5)), list(range(1000, 1040))]
    bitmask = np.zeros((2, 151_936 // 32), np.int32)
    for r, ids in enumerate(allowed):
        bits = np.zeros(151_936, np.uint8)
        bits[ids] = 1
        bitmask[r] = np.packbits(bits, bitorder="little").view(np.int32)
    masks = RowMasks(torch.from_numpy(bitmask), [1, 4])
    params = [SamplingParams(temperature=0.0, logprobs=2),
              SamplingParams(temperature=0.6, top_p=0.95, top_k=20, seed=1),
              SamplingParams(temperature=1.0, min_p=0.05, seed=2), SamplingParams(temperature=0.6, top_p=0.9, seed=3),
              SamplingParams(temperature=0.0, logprobs=1), SamplingParams(temperature=1.0, seed=4)]
    for step in range(4):
        native = sample(rows.clone(), params, [step] * 6, masks=masks)
        with monkeypatch.context() as switched:
            if device == "cpu":
                for kernel in ("sample_tokens", "greedy_tokens", "native_logprobs", "mask_logits"):
                    switched.setattr(sampler, kernel, None)
            other = sample(rows.clone().to(device), params, [step] * 6, masks=masks)
        assert [t.token_id for t in other] == [t.token_id for t in native], step
        for o, n in zip(other, native):
            assert o.logprob == pytest.approx(n.logprob, abs=1e-4)
            assert [t for t, _ in o.top] == [t for t, _ in n.top]
        assert native[1].token_id in allowed[0] and native[4].token_id in allowed[1]
