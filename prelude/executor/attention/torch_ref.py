"""Reference attention in plain torch: runs anywhere, and is the oracle for the CUDA backends."""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from kernels.cpu.ops import CachedContext, prefill_wins
from prelude.executor.flat_step import paged_rows
from prelude.executor.kv_cache import KVCache
from prelude.executor.attention.encoder_attention import bidirectional_attention
from prelude.executor.attention.row_attention import causal_attention, chunk_attention, items_attention
from prelude.model.attention import AttentionBackend, PagedStepInputs, QKNorm, StepLayout

paged_decode: Callable[..., None] | None
try:
    from kernels.cpu._native import paged_decode
except ImportError:  # the extension is not built (a source checkout before `pip install -e .`)
    paged_decode = None


class TorchAttention(AttentionBackend):
    """Prefill rows attend one at a time (cached prefix in its blocks + own tokens);
    single-token rows that store their K/V are batched: on the CPU in fp32 a native kernel reads
    their blocks where they lie (kernels/cpu/paged_attention.hpp), elsewhere one padded attention
    over gathered blocks. A prefill row's attention over its own tokens and its context is in
    row_attention (multi-item rows there too)."""

    supports_items = True

    def __init__(self, kv_cache: KVCache):
        self.kv_cache = kv_cache

    def plan(self, layout: StepLayout) -> None:
        # The per-layer structures are made on the first layer that needs them: a step the
        # native forward takes whole (prelude.executor.fused_step) reads only the layout, and making
        # them is a visible share of a small decode step (`python -m bench.kernels.decode_step`).
        self.layout = layout
        self._per_layer_planned = False

    def _plan_per_layer(self) -> None:
        if self._per_layer_planned:
            return
        self._per_layer_planned = True
        layout = self.layout
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
        self.batched_rows = None
        if batched:
            lengths = [layout.context_lens[r] + 1 for r in batched]
            max_blocks = -(-max(lengths) // block_size)
            tables = [list(layout.block_tables[r][:max_blocks]) for r in batched]
            tables = [t + [0] * (max_blocks - len(t)) for t in tables]
            self.batched_rows = torch.tensor([layout.query_starts[r] for r in batched], device=device)
            self.batched_tables = torch.tensor(tables, dtype=torch.long, device=device)
            self.batched_lengths = torch.tensor(lengths, dtype=torch.long, device=device)

    def paged_step_inputs(self) -> PagedStepInputs | None:
        layout, cache = self.layout, self.kv_cache
        if not self._native_cache(cache.k):
            return None
        paged = paged_rows(layout.query_starts, layout.context_lens, layout.block_tables, layout.store_kv,
                           layout.item_lengths, cache.block_size)
        dim = cache.shape.head_dim
        for row in range(paged.decode_from):
            n = layout.query_len(row)
            if not prefill_wins(n, layout.context_lens[row] + n, dim):
                return None
        item_starts = None if paged.item_starts is None else torch.tensor(paged.item_starts)
        item_lengths = None if paged.item_lengths is None else torch.tensor(paged.item_lengths)
        return PagedStepInputs(cache.k, cache.v, torch.tensor(layout.query_starts), torch.tensor(layout.context_lens),
                               torch.frombuffer(paged.tables, dtype=torch.long).view(layout.num_rows, paged.width),
                               layout.slot_mapping.contiguous(), paged.decode_from, item_starts, item_lengths)

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 rope: tuple[torch.Tensor, torch.Tensor] | None = None,
                 qk_norm: QKNorm | None = None) -> torch.Tensor:
        self._plan_per_layer()
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

    def bidirectional(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int = 0) -> torch.Tensor:
        return bidirectional_attention(q, k, v, self.layout.query_starts, window)

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
            return causal_attention(q[start:end], k[start:end], v[start:end])
        # a cached context: a prefix-cache hit, or the earlier chunks of the prompt
        context = CachedContext(k_cache, v_cache, prefix, ctx) if prefix is not None else None
        if items:
            return items_attention(q[start:end], k[start:end], v[start:end], context, items)
        return chunk_attention(q[start:end], k[start:end], v[start:end], context)

    @staticmethod
    def _native_cache(k_cache: torch.Tensor) -> bool:
        """The native kernels read this cache (fp32, contiguous, on the CPU)."""
        return (paged_decode is not None and k_cache.device.type == "cpu" and k_cache.dtype == torch.float32
                and k_cache.is_contiguous())

    def _native_decode(self, q: torch.Tensor, k_cache: torch.Tensor) -> bool:
        return (self._native_cache(k_cache) and q.dtype == torch.float32 and q.shape[-1] % 8 == 0
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

