"""The torch reference's multi-item attention (row_attention.items_attention), on both of its
paths (one dense mask for short rows, flash attentions merged by log-sum-exp for long ones),
equals one attention under the mask that defines multi-item rows (model.attention.own_token_mask,
the cached context seen by every token): with and without cached context (in scattered KV
blocks), a shared part or none (the whole query cached), equal and unequal items, grouped query
heads."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from bench.kernels.scattered_blocks import scattered_context
from prelude.executor.attention import row_attention
from prelude.model.attention import own_token_mask


def _dense(q, k, v, past_k, past_v, items):
    n, ctx = q.shape[0], 0 if past_k is None else past_k.shape[0]
    keys = k if past_k is None else torch.cat([past_k, k])
    values = v if past_v is None else torch.cat([past_v, v])
    mask = torch.cat([torch.ones(n, ctx, dtype=torch.bool), own_token_mask(n, items, q.device)], dim=1)
    qt, kt, vt = (x.transpose(0, 1).unsqueeze(0) for x in (q, keys, values))
    return F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, enable_gqa=True)[0].transpose(0, 1)


@pytest.mark.parametrize("ctx, shared, items", [
    (0, 7, (3, 1, 4)),
    (0, 5, (2, 2, 2, 2)),
    (9, 4, (5, 1)),
    (12, 0, (3, 6, 2)),  # the whole query cached: items over the context alone
    (0, 1, (1,)),
])
@pytest.mark.parametrize("heads, kv_heads", [(4, 4), (8, 2)])
@pytest.mark.parametrize("dense_up_to", [row_attention.DENSE_ITEM_TOKENS, 0])
def test_items_attention_equals_the_dense_mask(monkeypatch, ctx, shared, items, heads, kv_heads, dense_up_to):
    monkeypatch.setattr(row_attention, "DENSE_ITEM_TOKENS", dense_up_to)
    gen = torch.Generator().manual_seed(ctx * 100 + shared)
    n, dim = shared + sum(items), 16
    q = torch.randn(n, heads, dim, generator=gen)
    k, v = (torch.randn(n, kv_heads, dim, generator=gen) for _ in range(2))
    past_k, past_v = (torch.randn(ctx, kv_heads, dim, generator=gen) for _ in range(2)) if ctx else (None, None)
    context = scattered_context(past_k, past_v, 4, gen) if ctx else None
    got = row_attention.items_attention(q, k, v, context, items)
    torch.testing.assert_close(got, _dense(q, k, v, past_k, past_v, items), atol=1e-5, rtol=1e-5)
