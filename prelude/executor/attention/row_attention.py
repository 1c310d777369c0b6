"""One prefill row's attention over its own new tokens ([tokens, heads, D]) and, seen whole, its
cached context: the torch reference backend's math. In fp32 on the CPU a native kernel
(kernels/cpu/prefill_attention.hpp) attends a causal row over its context in one call, reading
the context from its KV blocks; elsewhere the context is gathered and torch's CPU flash kernel
runs where it applies, with partial attentions over disjoint keys merged by their log-sum-exps,
which keeps every call on the flash path where one masked call would take torch's quadratic
math path."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels.cpu.ops import CachedContext, causal_prefill
from prelude.model.attention import own_token_mask

# Multi-item rows seeing at most this many keys attend under one dense mask; longer ones in
# flash attentions merged by log-sum-exp (see items_attention for the figures).
DENSE_ITEM_TOKENS = 512


def chunk_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    context: CachedContext | None) -> torch.Tensor:
    """Causal attention of a chunk of queries (the last len(q) of the new keys k/v) over its own
    keys and all the keys before it: the cached context and the new keys before the chunk, seen
    whole. Off the native kernel, two flash attentions merged by their log-sum-exps: the same
    work as the chunk's rows of one causal attention, where a mask over all keys costs about
    twice that (`python -m bench.kernels.prefill_attention`)."""
    native = causal_prefill(q, k, v, context)
    if native is not None:
        return native
    n, heads = q.shape[0], q.shape[1]
    group = heads // k.shape[1]
    before = [context.gathered()] if context is not None and context.length else []
    if len(k) > n:
        before.append((k[:-n], v[:-n]))
    k, v = k[-n:], v[-n:]
    qt = _heads_first(q)
    out, lse = _flash_with_lse(qt, _heads_first(k, group), _heads_first(v, group), True)
    if before:
        past_k, past_v = (torch.cat(x) if len(x) > 1 else x[0] for x in zip(*before))
        out = _merged(out, lse, *_flash_with_lse(qt, _heads_first(past_k, group), _heads_first(past_v, group), False))
    return out[0].transpose(0, 1).reshape(n, heads, -1)


def items_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, context: CachedContext | None,
                    items: tuple[int, ...]) -> torch.Tensor:
    """A multi-item row's own tokens (the shared part, then the items) over its cached context
    and themselves, as model.attention.own_token_mask says.

    Up to DENSE_ITEM_TOKENS keys, one attention under that mask. Beyond, where the mask's
    quadratic math path costs most, the shared part attends as any chunk does; the items'
    queries attend to the context and the shared part in one flash attention, and each item to
    itself causally in one batched flash attention (items padded at their end to the longest,
    which causality hides); the two are merged by their log-sum-exps. The merged form wins by a
    wide margin at many items, the dense one at few keys (`python -m bench.kernels.multi_item`)."""
    n, heads = q.shape[0], q.shape[1]
    past_k, past_v = context.gathered() if context is not None and context.length else (None, None)
    keys_seen = n + (0 if past_k is None else len(past_k))
    if keys_seen <= DENSE_ITEM_TOKENS:
        return _masked_attention(q, k, v, past_k, past_v, own_token_mask(n, items, q.device))
    group = heads // k.shape[1]
    shared = n - sum(items)
    out = torch.empty_like(q)
    if shared:
        out[:shared] = chunk_attention(q[:shared], k[:shared], v[:shared], context)
    # Each item's tokens in a [items, longest] grid; a padding slot repeats the item's last token.
    longest = max(items)
    lengths = torch.tensor(items, device=q.device)
    first = torch.cumsum(lengths, 0) - lengths
    offset = torch.arange(longest, device=q.device)
    grid = first[:, None] + torch.minimum(offset[None, :], lengths[:, None] - 1)
    real = offset[None, :] < lengths[:, None]
    qi, ki, vi = q[shared:], k[shared:], v[shared:]
    own, own_lse = _flash_with_lse(qi[grid].transpose(1, 2), _grid_heads(ki[grid], group), _grid_heads(vi[grid], group),
                                   True)
    out_items = own.transpose(1, 2)[real]  # [tokens of the items, heads, D]
    lse_items = own_lse.transpose(1, 2)[real]
    keys = [x for x in (past_k, k[:shared]) if x is not None and len(x)]
    if keys:
        values = [x for x in (past_v, v[:shared]) if x is not None and len(x)]
        before, before_lse = _flash_with_lse(_heads_first(qi), _heads_first(torch.cat(keys), group),
                                             _heads_first(torch.cat(values), group), False)
        out_items = _merged(out_items, lse_items, before[0].transpose(0, 1), before_lse[0].transpose(0, 1))
    out[shared:] = out_items
    return out


def _masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, past_k: torch.Tensor | None,
                      past_v: torch.Tensor | None, own: torch.Tensor) -> torch.Tensor:
    """q over the context (seen whole) and its own keys under the [n, n] mask `own`."""
    n = q.shape[0]
    mask = own
    if past_k is not None and past_v is not None:
        k, v = torch.cat([past_k, k]), torch.cat([past_v, v])
        mask = torch.cat([own.new_ones(n, len(past_k)), own], dim=1)
    qt, kt, vt = (x.transpose(0, 1).unsqueeze(0) for x in (q, k, v))
    return F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, enable_gqa=True)[0].transpose(0, 1)


def _heads_first(x: torch.Tensor, group: int = 1) -> torch.Tensor:
    """[tokens, heads, D] -> [1, heads * group, tokens, D]: each KV head repeated for the
    `group` query heads it serves (torch's CPU flash kernel takes no grouped heads)."""
    x = x.transpose(0, 1).unsqueeze(0)
    return x.repeat_interleave(group, dim=1) if group > 1 else x


def _grid_heads(x: torch.Tensor, group: int) -> torch.Tensor:
    """[items, longest, heads, D] -> [items, heads * group, longest, D]."""
    x = x.transpose(1, 2)
    return x.repeat_interleave(group, dim=1) if group > 1 else x


def _merged(out: torch.Tensor, lse: torch.Tensor, other: torch.Tensor, other_lse: torch.Tensor) -> torch.Tensor:
    """Two partial attentions of the same queries over disjoint keys, merged by their natural
    log-sum-exps; `lse` has out's shape without its last dimension. No caller merges a third
    part, so the merged log-sum-exp is not computed."""
    top = torch.maximum(lse, other_lse)
    w, other_w = (lse - top).exp().unsqueeze(-1), (other_lse - top).exp().unsqueeze(-1)
    return (out * w + other * other_w) / (w + other_w)


def _flash_with_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention with its log-sum-exp ([1, H, n, D] and [1, H, n]): torch's CPU flash kernel, or
    the explicit softmax elsewhere."""
    if q.device.type == "cpu":
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q.contiguous(), k.contiguous(),
                                                                              v.contiguous(), 0.0, causal)
        return out, lse
    scores = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    if causal:
        scores = scores.masked_fill(torch.ones_like(scores, dtype=torch.bool).triu(1), float("-inf"))
    return scores.softmax(-1) @ v, scores.logsumexp(-1)


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """q, k, v: [n, heads, D] of one row from its first token."""
    native = causal_prefill(q, k, v)
    if native is not None:
        return native
    # 4-D [1, heads, tokens, dim]: torch's CPU flash kernel takes this shape; 3-D falls back to
    # the math path, several times slower.
    qt, kt, vt = (x.transpose(0, 1).unsqueeze(0) for x in (q, k, v))
    o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, enable_gqa=True)
    return o[0].transpose(0, 1)
