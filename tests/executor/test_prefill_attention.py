"""The CPU prefill attention kernel equals softmax(q K^T / sqrt(d)) V with query i of n seeing
keys [0, m - n + i] of m, for GQA groups, head sizes, rows shorter and longer than its tiles
and key blocks, a cached context before the row, and q read from a wider projection output."""
from __future__ import annotations

import pytest
import torch

from kernels.cpu import ops


def reference(q, k, v):
    n, heads, dim = q.shape
    m, kv_heads = k.shape[0], k.shape[1]
    keys = k.repeat_interleave(heads // kv_heads, dim=1)
    values = v.repeat_interleave(heads // kv_heads, dim=1)
    scores = torch.einsum("nhd,mhd->hnm", q.double(), keys.double()) / dim ** 0.5
    seen = torch.ones(n, m, dtype=torch.bool).tril(m - n)
    scores = scores.masked_fill(~seen, float("-inf"))
    return torch.einsum("hnm,mhd->nhd", scores.softmax(-1), values.double()).float()


@pytest.mark.skipif(not ops.built, reason="kernels.cpu is not built")
@pytest.mark.parametrize("heads,kv_heads,dim", [(4, 4, 8), (8, 4, 32), (16, 8, 64), (16, 2, 128), (6, 1, 40)])
@pytest.mark.parametrize("n,past", [(1, 0), (17, 0), (128, 0), (150, 0), (5, 300), (70, 33)])
@pytest.mark.parametrize("threads", [1, 3])
def test_equals_causal_attention_over_the_context_and_the_row(heads, kv_heads, dim, n, past, threads):
    gen = torch.Generator().manual_seed(heads * 1000 + dim * 10 + n + past)
    # q as the model has it: a view into the fused q/k/v projection's output, tokens wider apart
    qkv = torch.randn(n, heads + 2 * kv_heads, dim, generator=gen)
    q = qkv[:, :heads]
    k = torch.randn(past + n, kv_heads, dim, generator=gen)
    v = torch.randn(past + n, kv_heads, dim, generator=gen)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        out = ops.causal_prefill(q, k[past:], v[past:], k[:past], v[:past])
    finally:
        torch.set_num_threads(before)
    assert out is not None
    torch.testing.assert_close(out, reference(q, k, v), rtol=1e-5, atol=1e-5)


def test_declines_what_it_does_not_compute():
    """Other dtypes, head sizes that are not multiples of 8, and heads of 128 over many keys
    (torch's kernel is faster there) are left to the caller's reference attention."""
    q, k = torch.randn(4, 4, 16), torch.randn(4, 2, 16)
    assert ops.causal_prefill(q.double(), k.double(), k.double()) is None
    assert ops.causal_prefill(torch.randn(4, 4, 12), torch.randn(4, 2, 12), torch.randn(4, 2, 12)) is None
    wide, context = torch.randn(4, 2, 128), torch.randn(ops.WIDE_HEAD_MAX_KEYS, 2, 128)
    assert ops.causal_prefill(wide, wide, wide, context, context) is None
    assert ops.causal_prefill(wide, wide, wide, context[:100], context[:100]) is not None
