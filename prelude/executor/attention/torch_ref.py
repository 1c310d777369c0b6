"""Reference attention in plain torch: runs anywhere, and is the oracle for the CUDA backends."""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from prelude.executor.kv_cache import KVCache
from prelude.model.attention import AttentionBackend, PagedDecodeInputs, QKNorm, StepLayout, own_token_mask
from prelude.model.segments import SEGMENT_TOKENS

paged_decode: Callable[..., None] | None
try:
    from kernels.cpu._native import paged_decode
except ImportError:  # the extension is not built (a source checkout before `pip install -e .`)
    paged_decode = None


# Multi-item rows seeing at most this many keys attend under one dense mask; longer ones in
# flash attentions merged by log-sum-exp (see _items_attention for the figures).
DENSE_ITEM_TOKENS = 512


class TorchAttention(AttentionBackend):
    """Prefill rows attend one at a time (cached prefix gathered from blocks + own tokens);
    single-token rows that store their K/V are batched: on the CPU in fp32 a native kernel reads
    their blocks where they lie (kernels/cpu/paged_attention.hpp), elsewhere one padded attention
    over gathered blocks. Multi-item rows attend as model.attention.own_token_mask says (items see
    the shared part and themselves), in flash attentions merged by their log-sum-exps."""

    supports_items = True
    supports_head_ranges = True

    def __init__(self, kv_cache: KVCache):
        self.kv_cache = kv_cache

    def plan(self, layout: StepLayout) -> None:
        device = layout.slot_mapping.device
        block_size = self.kv_cache.block_size
        # Which of this step's tokens are stored, and where: computed once, used by every layer.
        stored = (layout.slot_mapping >= 0).nonzero().squeeze(1)
        self.stored_tokens = None if len(stored) == len(layout.slot_mapping) else stored
        self.stored_slots = layout.slot_mapping if self.stored_tokens is None else layout.slot_mapping[stored]
        self.prefills = []  # (start, end, context_len, prefix block ids | None, item lengths)
        batched = []  # rows answered by the padded single-token path
        for row in range(layout.num_rows):
            start, ctx = layout.query_starts[row], layout.context_lens[row]
            if layout.query_len(row) == 1 and layout.store_kv[row]:
                batched.append(row)
                continue
            num_blocks = -(-ctx // block_size)
            prefix = (
                torch.tensor(layout.block_tables[row][:num_blocks], dtype=torch.long, device=device)
                if ctx else None
            )
            items = layout.item_lengths[row] if layout.item_lengths is not None else ()
            self.prefills.append((start, layout.query_starts[row + 1], ctx, prefix, items))
        # A segmented forward attends a KV head's queries a segment at a time (multi-item rows whole).
        self.query_chunks = [(i, a, end - start if items else min(a + SEGMENT_TOKENS, end - start))
                             for i, (start, end, _, _, items) in enumerate(self.prefills)
                             for a in ((0,) if items else range(0, end - start, SEGMENT_TOKENS))]
        self.batched_rows = None
        if batched:
            lengths = [layout.context_lens[r] + 1 for r in batched]
            max_blocks = -(-max(lengths) // block_size)
            tables = [list(layout.block_tables[r][:max_blocks]) for r in batched]
            tables = [t + [0] * (max_blocks - len(t)) for t in tables]
            self.batched_rows = torch.tensor([layout.query_starts[r] for r in batched], device=device)
            self.batched_tables = torch.tensor(tables, dtype=torch.long, device=device)
            self.batched_lengths = torch.tensor(lengths, dtype=torch.long, device=device)
        self.slot_mapping = layout.slot_mapping

    def paged_decode_inputs(self) -> PagedDecodeInputs | None:
        cache = self.kv_cache
        decode_only = self.batched_rows is not None and not self.prefills and self.stored_tokens is None
        if not decode_only or not self._native_decode_cache(cache.k):
            return None
        return PagedDecodeInputs(cache.k, cache.v, self.slot_mapping, self.batched_tables, self.batched_lengths)

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 rope: tuple[torch.Tensor, torch.Tensor] | None = None,
                 qk_norm: QKNorm | None = None) -> torch.Tensor:
        k_cache, v_cache = self.kv_cache.layer(layer)
        out = self._prefill_rows(k_cache, v_cache, q, k, v)
        if self.batched_rows is not None and self._native_decode(q, k_cache):
            out[self.batched_rows] = self._paged_decode(q, k_cache, v_cache)
        elif self.batched_rows is not None:
            keys = k_cache[self.batched_tables].flatten(1, 2)  # [B, L, Hkv, D]
            values = v_cache[self.batched_tables].flatten(1, 2)
            queries = q[self.batched_rows].unsqueeze(2)  # [B, H, 1, D]
            key_pos = torch.arange(keys.shape[1], device=q.device)
            mask = (key_pos[None, :] < self.batched_lengths[:, None])[:, None, None, :]
            o = F.scaled_dot_product_attention(
                queries, keys.transpose(1, 2), values.transpose(1, 2), attn_mask=mask, enable_gqa=True,
            )
            out[self.batched_rows] = o.squeeze(2)
        return out

    def head_chunks(self) -> int:
        return len(self.query_chunks)

    def attend_heads(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     kv_heads: tuple[int, int], chunk: int) -> tuple[int, int, torch.Tensor]:
        assert self.batched_rows is None, "head ranges are for steps of prefill rows"
        k_cache, v_cache = self.kv_cache.layer(layer)
        first, last = kv_heads
        k_cache, v_cache = k_cache[:, :, first:last], v_cache[:, :, first:last]
        if chunk == 0:
            self._store(k_cache, v_cache, k, v)
        row, a, b = self.query_chunks[chunk]
        start, end, ctx, prefix, items = self.prefills[row]
        if items:
            return start, end, self._attend_row(k_cache, v_cache, q, k, v, start, end, ctx, prefix, items)
        past_k = past_v = None
        if prefix is not None or a:
            past_k, past_v = _with_prefix(k_cache, v_cache, prefix, ctx, k[start:start + a], v[start:start + a])
        own = slice(start + a, start + b)
        return start + a, start + b, _chunk_attention(q[own], k[own], v[own], past_k, past_v)

    def _prefill_rows(self, k_cache: torch.Tensor, v_cache: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                      v: torch.Tensor) -> torch.Tensor:
        """Stores the step's K/V, and attends its prefill rows."""
        self._store(k_cache, v_cache, k, v)
        out = torch.empty_like(q)
        for start, end, ctx, prefix, items in self.prefills:
            out[start:end] = self._attend_row(k_cache, v_cache, q, k, v, start, end, ctx, prefix, items)
        return out

    def _store(self, k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """The step's K/V into the cache (which may be a slice of the KV heads)."""
        if len(self.stored_slots):
            new_k, new_v = k, v
            if self.stored_tokens is not None:
                new_k, new_v = k.index_select(0, self.stored_tokens), v.index_select(0, self.stored_tokens)
            k_cache.flatten(0, 1).index_copy_(0, self.stored_slots, new_k)
            v_cache.flatten(0, 1).index_copy_(0, self.stored_slots, new_v)

    @staticmethod
    def _attend_row(k_cache: torch.Tensor, v_cache: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                    v: torch.Tensor, start: int, end: int, ctx: int, prefix: torch.Tensor | None,
                    items: tuple[int, ...]) -> torch.Tensor:
        if prefix is None and not items:
            return _causal_attention(q[start:end], k[start:end], v[start:end])
        # a cached context: a prefix-cache hit, or the earlier chunks of the prompt
        past_k, past_v = _context(k_cache, v_cache, prefix, ctx) if prefix is not None else (None, None)
        if items:
            return _items_attention(q[start:end], k[start:end], v[start:end], past_k, past_v, items)
        return _chunk_attention(q[start:end], k[start:end], v[start:end], past_k, past_v)

    @staticmethod
    def _native_decode_cache(k_cache: torch.Tensor) -> bool:
        """The native kernels read this cache (fp32, contiguous, on the CPU)."""
        return (paged_decode is not None and k_cache.device.type == "cpu" and k_cache.dtype == torch.float32
                and k_cache.is_contiguous())

    def _native_decode(self, q: torch.Tensor, k_cache: torch.Tensor) -> bool:
        return (self._native_decode_cache(k_cache) and q.dtype == torch.float32 and q.shape[-1] % 8 == 0
                and q.shape[1] % k_cache.shape[2] == 0)

    def _paged_decode(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
        """The batched rows' attention, reading K and V from their blocks in place."""
        assert paged_decode is not None and self.batched_rows is not None
        queries = q[self.batched_rows].contiguous()  # [B, H, D]
        result = torch.empty_like(queries)
        rows, heads, dim = queries.shape
        _, block_size, kv_heads, _ = k_cache.shape
        # The kernel keeps few keys on one thread (kernels/cpu/team.hpp, threads_worth).
        paged_decode(queries.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), self.batched_tables.data_ptr(),
                     self.batched_lengths.data_ptr(), result.data_ptr(), rows, heads, kv_heads, dim, block_size,
                     self.batched_tables.shape[1], dim ** -0.5, torch.get_num_threads())
        return result


def _with_prefix(k_cache: torch.Tensor, v_cache: torch.Tensor, prefix: torch.Tensor | None, ctx: int,
                 k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The row's cached context (its first `ctx` tokens, gathered from its prefix blocks) followed
    by the keys and values k, v."""
    if prefix is None:
        return k, v
    past_k, past_v = _context(k_cache, v_cache, prefix, ctx)
    return torch.cat([past_k, k]), torch.cat([past_v, v])


def _context(k_cache: torch.Tensor, v_cache: torch.Tensor, prefix: torch.Tensor,
             ctx: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The keys and values of a row's first `ctx` tokens, gathered from its prefix blocks."""
    return k_cache[prefix].flatten(0, 1)[:ctx], v_cache[prefix].flatten(0, 1)[:ctx]


def _chunk_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, past_k: torch.Tensor | None,
                     past_v: torch.Tensor | None) -> torch.Tensor:
    """Causal attention of a chunk of queries over its own keys and all the keys before it
    (past_k/v, seen whole), as two flash attentions merged by their log-sum-exps: the same work
    as the chunk's rows of one causal attention, where a mask over all keys cost twice that
    (2,048 queries over 6,144 cached keys, demo model's heads: 120 against 214 ms)."""
    n, heads = q.shape[0], q.shape[1]
    group = heads // k.shape[1]
    qt = _heads_first(q)
    out, lse = _flash_with_lse(qt, _heads_first(k, group), _heads_first(v, group), True)
    if past_k is not None and past_v is not None and len(past_k):
        out, _ = _merged(out, lse, *_flash_with_lse(qt, _heads_first(past_k, group), _heads_first(past_v, group), False))
    return out[0].transpose(0, 1).reshape(n, heads, -1)


def _items_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, past_k: torch.Tensor | None,
                     past_v: torch.Tensor | None, items: tuple[int, ...]) -> torch.Tensor:
    """A multi-item row's own tokens (the shared part, then the items) over its cached context
    (past_k/v) and themselves, as model.attention.own_token_mask says.

    Up to DENSE_ITEM_TOKENS keys, one attention under that mask. Beyond, where the mask's
    quadratic math path costs most, the shared part attends as any chunk does; the items'
    queries attend to the context and the shared part in one flash attention, and each item to
    itself causally in one batched flash attention (items padded at their end to the longest,
    which causality hides); the two are merged by their log-sum-exps. A 300-token query, items
    of 10 tokens, one layer's attention (micro-benchmark, min of 15): Qwen3-0.6B's heads
    (16/8 x 128) at 200 items 280 -> 60-66 ms, at 50 items 33-37 -> 28-31 ms, at 10 items
    (400 keys) 9.5-9.9 ms dense against 13-16 ms merged; demo model's heads at 200 items 82 -> 13 ms."""
    n, heads = q.shape[0], q.shape[1]
    keys_seen = n + (0 if past_k is None else len(past_k))
    if keys_seen <= DENSE_ITEM_TOKENS:
        return _masked_attention(q, k, v, past_k, past_v, own_token_mask(n, items, q.device))
    group = heads // k.shape[1]
    shared = n - sum(items)
    out = torch.empty_like(q)
    if shared:
        out[:shared] = _chunk_attention(q[:shared], k[:shared], v[:shared], past_k, past_v)
    # Each item's tokens in a [items, longest] grid; a padding slot repeats the item's last token.
    longest = max(items)
    lengths = torch.tensor(items, device=q.device)
    first = torch.cumsum(lengths, 0) - lengths
    offset = torch.arange(longest, device=q.device)
    grid = first[:, None] + torch.minimum(offset[None, :], lengths[:, None] - 1)
    real = offset[None, :] < lengths[:, None]
    qi, ki, vi = q[shared:], k[shared:], v[shared:]
    own, own_lse = _flash_with_lse(qi[grid].transpose(1, 2), _grid_heads(ki[grid], group), _grid_heads(vi[grid], group), True)
    out_items = own.transpose(1, 2)[real]  # [tokens of the items, heads, D]
    lse_items = own_lse.transpose(1, 2)[real]
    keys = [x for x in (past_k, k[:shared]) if x is not None and len(x)]
    if keys:
        values = [x for x in (past_v, v[:shared]) if x is not None and len(x)]
        before, before_lse = _flash_with_lse(_heads_first(qi), _heads_first(torch.cat(keys), group),
                                             _heads_first(torch.cat(values), group), False)
        out_items, _ = _merged(out_items, lse_items, before[0].transpose(0, 1), before_lse[0].transpose(0, 1))
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


def _merged(out: torch.Tensor, lse: torch.Tensor, other: torch.Tensor,
            other_lse: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Two partial attentions of the same queries over disjoint keys, merged by their natural
    log-sum-exps; `lse` has out's shape without its last dimension."""
    top = torch.maximum(lse, other_lse)
    w, other_w = (lse - top).exp(), (other_lse - top).exp()
    merged = (out * w.unsqueeze(-1) + other * other_w.unsqueeze(-1)) / (w + other_w).unsqueeze(-1)
    return merged, top + (w + other_w).log()


def _flash_with_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
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


def _causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """q, k, v: [n, heads, D] of one row from its first token."""
    # 4-D [1, heads, tokens, dim]: torch's CPU flash kernel takes this shape; 3-D falls back to
    # the math path, several times slower.
    qt, kt, vt = (x.transpose(0, 1).unsqueeze(0) for x in (q, k, v))
    o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, enable_gqa=True)
    return o[0].transpose(0, 1)
