"""The CPU decode attention that reads KV blocks in place equals softmax(q K^T / sqrt(d)) V over
each row's own keys, for GQA groups, scattered block tables and ragged lengths."""
from __future__ import annotations

import pytest
import torch

from prelude.executor.attention.torch_ref import paged_decode


def reference(q, k_cache, v_cache, tables, lengths):
    rows, heads, dim = q.shape
    kv_heads = k_cache.shape[2]
    out = torch.empty_like(q)
    for r in range(rows):
        keys = k_cache[tables[r]].flatten(0, 1)[:lengths[r]]  # [L, Hkv, D]
        values = v_cache[tables[r]].flatten(0, 1)[:lengths[r]]
        keys = keys.repeat_interleave(heads // kv_heads, dim=1)
        values = values.repeat_interleave(heads // kv_heads, dim=1)
        scores = torch.einsum("hd,lhd->hl", q[r], keys) / dim ** 0.5
        out[r] = torch.einsum("hl,lhd->hd", scores.softmax(-1), values)
    return out


@pytest.mark.skipif(paged_decode is None, reason="kernels.cpu is not built")
@pytest.mark.parametrize("heads,kv_heads,dim", [(4, 4, 8), (8, 4, 64), (16, 2, 128), (6, 1, 16)])
@pytest.mark.parametrize("threads", [1, 3])
def test_equals_attention_over_gathered_blocks(heads, kv_heads, dim, threads):
    gen = torch.Generator().manual_seed(heads * 1000 + dim + threads)
    blocks, block_size = 64, 16
    k_cache = torch.randn(blocks, block_size, kv_heads, dim, generator=gen)
    v_cache = torch.randn(blocks, block_size, kv_heads, dim, generator=gen)
    lengths = [1, 16, 17, 300, 5]
    width = max(-(-n // block_size) for n in lengths)
    scattered = torch.randperm(blocks, generator=gen)
    tables = torch.zeros(len(lengths), width, dtype=torch.long)
    at = 0
    for r, n in enumerate(lengths):
        used = -(-n // block_size)
        tables[r, :used] = scattered[at:at + used]
        at += used
    q = torch.randn(len(lengths), heads, dim, generator=gen)
    out = torch.empty_like(q)
    lens = torch.tensor(lengths)  # kept alive: the kernel reads through its pointer
    paged_decode(q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), tables.data_ptr(),
                 lens.data_ptr(), out.data_ptr(), len(lengths), heads, kv_heads, dim,
                 block_size, width, dim ** -0.5, threads)
    torch.testing.assert_close(out, reference(q, k_cache, v_cache, tables, lengths), rtol=1e-5, atol=1e-5)
