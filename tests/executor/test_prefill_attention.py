"""The CPU prefill attention kernel equals softmax(q K^T / sqrt(d)) V with query i of n seeing
keys [0, m - n + i] of m, for GQA groups, head sizes, rows shorter and longer than its tiles
and key blocks, a cached context before the row read from KV blocks scattered in the cache
(the last one partial, the cache maybe a slice of its heads), new keys before the queries, and
q read from a wider projection output."""
from __future__ import annotations

import pytest
import torch

from bench.kernels.scattered_blocks import scattered_context
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


def _threads(threads, fn):
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return fn()
    finally:
        torch.set_num_threads(before)


@pytest.mark.skipif(not ops.built, reason="kernels.cpu is not built")
@pytest.mark.parametrize("heads,kv_heads,dim", [(4, 4, 8), (8, 4, 32), (16, 8, 64), (16, 2, 128), (6, 1, 40)])
# (queries, new keys, cached context, KV block size): a row from its start, a short suffix over a
# long context, new keys before the queries (a later segment of a segmented row)
@pytest.mark.parametrize("n,fresh,past,block_size", [
    (1, 1, 0, 16), (17, 17, 0, 16), (128, 128, 0, 16), (150, 150, 0, 16), (333, 333, 0, 16), (1000, 1000, 0, 16),
    (3, 20, 0, 16),
    (5, 5, 300, 16), (70, 70, 33, 16), (70, 70, 33, 5), (16, 16, 1000, 16), (64, 64, 960, 7), (9, 40, 37, 16),
])
@pytest.mark.parametrize("threads", [1, 3])
def test_equals_causal_attention_over_the_context_and_the_row(heads, kv_heads, dim, n, fresh, past, block_size,
                                                              threads):
    gen = torch.Generator().manual_seed(heads * 1000 + dim * 10 + n + past + block_size)
    # q as the model has it: a view into the fused q/k/v projection's output, tokens wider apart
    qkv = torch.randn(n, heads + 2 * kv_heads, dim, generator=gen)
    q = qkv[:, :heads]
    k = torch.randn(past + fresh, kv_heads, dim, generator=gen)
    v = torch.randn(past + fresh, kv_heads, dim, generator=gen)
    context = scattered_context(k[:past], v[:past], block_size, gen) if past else None
    out = _threads(threads, lambda: ops.causal_prefill(q, k[past:], v[past:], context))
    assert out is not None
    # Where the CPU has AMX, a row of its own keys (no context) of 80 to 8,192 tokens whose heads
    # are a multiple of 32 wide attends on the tiles in bf16x3 (amx_attention.hpp), within a few
    # 2^-16; the rest on the vector kernel, as fp32.
    from kernels.cpu._native import amx_products
    tiles = amx_products() and dim % 32 == 0 and past == 0 and fresh == n and 80 <= n <= 8192
    tolerance = 4e-5 if tiles else 1e-5
    torch.testing.assert_close(out, reference(q, k, v), rtol=tolerance, atol=tolerance)


@pytest.mark.skipif(not ops.built, reason="kernels.cpu is not built")
@pytest.mark.parametrize("dim", [32, 64, 128])
def test_reads_a_slice_of_the_cache_heads(dim):
    """A segmented forward attends one KV head at a time: the cache is a view of some of its heads."""
    gen = torch.Generator().manual_seed(dim)
    n, past, kv_heads, group = 24, 100, 4, 2
    k = torch.randn(past + n, kv_heads, dim, generator=gen)
    v = torch.randn(past + n, kv_heads, dim, generator=gen)
    q = torch.randn(n, kv_heads * group, dim, generator=gen)
    whole = scattered_context(k[:past], v[:past], 16, gen)
    for h in range(kv_heads):
        heads = slice(h * group, (h + 1) * group)
        context = ops.CachedContext(whole.k_cache[:, :, h:h + 1], whole.v_cache[:, :, h:h + 1], whole.blocks, past)
        out = ops.causal_prefill(q[:, heads], k[past:, h:h + 1], v[past:, h:h + 1], context)
        assert out is not None
        torch.testing.assert_close(out, reference(q[:, heads], k[:, h:h + 1], v[:, h:h + 1]), rtol=1e-5, atol=1e-5)


def test_declines_what_it_does_not_compute():
    """Other dtypes, head sizes that are not multiples of 8, and long chunks of heads of 128 over
    many keys (torch's kernel is faster there) are left to the caller's reference attention."""
    q, k = torch.randn(4, 4, 16), torch.randn(4, 2, 16)
    assert ops.causal_prefill(q.double(), k.double(), k.double()) is None
    assert ops.causal_prefill(torch.randn(4, 4, 12), torch.randn(4, 2, 12), torch.randn(4, 2, 12)) is None
    long, context = torch.randn(ops.WIDE_HEAD_MAX_QUERIES + 1, 2, 128), torch.randn(ops.WIDE_HEAD_MAX_KEYS, 2, 128)
    assert ops.causal_prefill(long, long, long, ops.CachedContext.whole(context, context)) is None
    assert ops.causal_prefill(long, long, long, ops.CachedContext.whole(context[:100], context[:100])) is not None
    short = long[:ops.WIDE_HEAD_MAX_QUERIES]
    assert ops.causal_prefill(short, short, short, ops.CachedContext.whole(context, context)) is not None


@pytest.mark.skipif(not ops.built, reason="kernels.cpu is not built")
@pytest.mark.parametrize("lengths", [[1], [22] * 32, [200, 3, 1, 64, 17, 120, 9], [5, 300], [1100, 7]])
@pytest.mark.parametrize("heads,dim", [(12, 32), (4, 64), (6, 48), (5, 40)])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_an_encoder_steps_rows_attend_to_their_own_tokens_in_one_call(lengths, heads, dim, threads):
    """Rows of an encoder step, bidirectional, each over its own tokens only, split across the
    threads by work (ranges crossing rows). Where the CPU has AMX, heads of 32 or 64 dims and rows
    of 80 to 8,192 tokens run on its tiles, in bf16x3 (amx_attention.hpp), a head's queries 256 at
    a time: within a few 2^-16 of the fp32 result; the rest (shorter rows, dims 40 and 48) on the
    vector kernel, as fp32: a step's rows may take either."""
    from kernels.cpu._native import amx_products
    from prelude.executor.attention import encoder_attention

    gen = torch.Generator().manual_seed(sum(lengths) + threads + dim)
    tokens = sum(lengths)
    qkv = torch.randn(tokens, 3 * heads, dim, generator=gen)  # as the fused projection leaves them
    q, k, v = qkv[:, :heads], qkv[:, heads:2 * heads], qkv[:, 2 * heads:]
    starts = [0]
    for n in lengths:
        starts.append(starts[-1] + n)
    out = _threads(threads, lambda: encoder_attention.bidirectional_attention(q, k, v, starts))
    for start, end in zip(starts, starts[1:]):
        scores = torch.einsum("nhd,mhd->hnm", q[start:end].double(), k[start:end].double()) / dim ** 0.5
        expected = torch.einsum("hnm,mhd->nhd", scores.softmax(-1), v[start:end].double()).float()
        tiles = amx_products() and dim % 32 == 0 and 80 <= end - start <= 8192
        tolerance = 4e-5 if tiles else 1e-5
        torch.testing.assert_close(out[start:end], expected, rtol=tolerance, atol=tolerance)
