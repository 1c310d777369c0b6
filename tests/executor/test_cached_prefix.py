"""The torch reference backend's prompt rows over a cached prefix whose KV blocks are scattered in
the cache (not contiguous, not in order, the last one partial) equal softmax(q K^T / sqrt(d)) V
over the prefix and the row, for GQA groups and heads of 32, 64 and 128, on the native kernel and on torch's: rows
that store their K/V, and rows that store none."""
from __future__ import annotations

import pytest
import torch

from bench.kernels.scattered_blocks import scatter, scattered_table
from prelude.contract.batch import PrefillRow
from prelude.executor.attention.torch_ref import TorchAttention
from prelude.executor.host_step import host_step
from prelude.executor.kv_cache import KVCache, KVCacheShape
from tests.executor.test_prefill_attention import reference

BLOCK = 16


def _row(heads, kv_heads, dim, prefix, n, stores, seed):
    """(attention planned for one row of n tokens over `prefix` cached ones, q, k, v, the prefix's K/V)."""
    gen = torch.Generator().manual_seed(seed)
    table = scattered_table(prefix + n, BLOCK, gen, spare=5)
    shape = KVCacheShape(1, len(table) + 5, BLOCK, kv_heads, dim, torch.float32)
    attention = TorchAttention(KVCache(shape, torch.device("cpu")))
    past_k, past_v = (torch.randn(prefix, kv_heads, dim, generator=gen) for _ in range(2))
    k_cache, v_cache = attention.kv_cache.layer(0)
    scatter(k_cache, table, past_k)
    scatter(v_cache, table, past_v)
    covered = table.tolist() if stores else table[:-(-prefix // BLOCK)].tolist()
    step = host_step([PrefillRow(0, list(range(n)), prefix, covered, None)], (), BLOCK)
    attention.plan(step.layout(step.slots))
    q = torch.randn(n, heads, dim, generator=gen)
    k, v = (torch.randn(n, kv_heads, dim, generator=gen) for _ in range(2))
    return attention, q, k, v, past_k, past_v


# the last: a chunk long enough for torch's kernel (kernels.cpu.ops.WIDE_HEAD), over the gathered context
CASES = [(8, 4, 32, 37, 20), (8, 2, 64, 300, 33), (16, 8, 128, 37, 20), (8, 4, 128, 2000, 32), (8, 2, 128, 600, 520)]


# a one-token row that stores its K/V is a decode row; one that stores none, a prompt row
@pytest.mark.parametrize("heads,kv_heads,dim,prefix,n", CASES + [(4, 4, 32, 47, 1)])
@pytest.mark.parametrize("stores", [True, False])
def test_row_over_a_scattered_prefix(heads, kv_heads, dim, prefix, n, stores):
    attention, q, k, v, past_k, past_v = _row(heads, kv_heads, dim, prefix, n, stores, dim + prefix + n)
    out = attention(0, q, k, v)
    expected = reference(q, torch.cat([past_k, k]), torch.cat([past_v, v]))
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
