"""Attention through flashinfer's batch kernels on the NHD paged cache.

Per step (`plan`): one ragged causal prefill over all prefill rows' own tokens (under a custom
mask when the step has multi-item rows, which see the shared part and their own item); one paged
prefill (non-causal) over the cached context of the prefill rows that have one, merged into
the ragged result by log-sum-exp; one paged decode for the decode rows. Each wrapper is planned
once per step on host index arrays (flashinfer_plan.build_plan) and run once per layer. An
encoder's step instead runs one ragged non-causal prefill per layer (`bidirectional`), planned at
its first layer.

Per layer (`__call__`): K/V are stored first (by kernels.rope's fused norm+RoPE+write when
Triton is there, else by index_copy_ over the planned slots), so decode rows read their own
token from the cache. Nothing in `__call__` syncs with the host, which lets CUDA graphs
capture pure decode steps and steps of fresh prefill rows (see `plan_graph`).
"""
from __future__ import annotations

import logging
import os
from typing import Any, Sequence

import torch

from prelude.executor.attention.flashinfer_plan import FlashInferPlan, PagedRows, build_plan, pad_decode_rows
from prelude.executor.kv_cache import KVCache
from prelude.executor.attention.encoder_attention import bidirectional_attention
from prelude.model.attention import AttentionBackend, GraphKind, QKNorm, StepLayout, own_token_mask

logger = logging.getLogger(__name__)

WORKSPACE_BYTES = 256 * 2**20  # flashinfer's split-kv scratch, shared by all wrappers
# flashinfer's prefill implementation: "auto" (fa3 on Hopper) or "fa2", whose JIT build is
# much shorter; an operator knob for time-boxed device runs, not a tuning parameter.
PREFILL_BACKEND = os.environ.get("PRELUDE_FLASHINFER_PREFILL", "auto")


def _host(values: Sequence[int]) -> torch.Tensor:
    # flashinfer plans on host int32 arrays and copies what the kernels need itself.
    return torch.tensor(values, dtype=torch.int32)


class FlashInferAttention(AttentionBackend):
    supports_items = True

    def __init__(self, kv_cache: KVCache, num_q_heads: int, max_pages_per_row: int,
                 dummy_page: int, fuse_rope: bool | None = None,
                 workspace_bytes: int = WORKSPACE_BYTES):
        """`dummy_page`: a cache block no sequence owns (padding rows of graph buckets read and
        write it). `fuse_rope`: use kernels.rope for norm+RoPE+KV write (default: when Triton
        is available)."""
        import flashinfer

        self.kv_cache = kv_cache
        self._fi = flashinfer
        shape = kv_cache.shape
        self.device = kv_cache.k.device
        self.dtype = shape.dtype
        self.num_q_heads = num_q_heads
        self.num_kv_heads = shape.num_kv_heads
        self.head_dim = shape.head_dim
        self.page_size = shape.block_size
        self.max_pages_per_row = max_pages_per_row
        self.dummy_page = dummy_page
        if fuse_rope is None:
            from kernels import available

            fuse_rope = available(self.device.type)
        self.fuses_rope = fuse_rope
        # Prefill graphs read the static slot buffer, which only the fused KV write does.
        self.graph_kinds = frozenset(("decode", "prefill") if fuse_rope else ("decode",))
        # Tensor-core decode pays off once several query heads share a KV head.
        self.decode_tensor_cores = num_q_heads // shape.num_kv_heads >= 4
        self.workspace = torch.zeros(workspace_bytes, dtype=torch.uint8, device=self.device)
        self.ragged = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(
            self.workspace, "NHD", backend=PREFILL_BACKEND)
        # Steps with multi-item rows. A wrapper of their own: flashinfer keeps a wrapper's custom
        # mask for its later plans, and fa3 takes no custom mask.
        self.masked = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(self.workspace, "NHD", backend="fa2")
        self.prefix = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
            self.workspace, "NHD", backend=PREFILL_BACKEND)
        self.decode = self._decode_wrapper()
        self.encoder = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(self.workspace, "NHD", backend=PREFILL_BACKEND)
        self._encoder_planned = False
        self.graph_decoders: dict[int, Any] = {}
        self.graph_prefills: dict[int, Any] = {}
        self._plan: FlashInferPlan | None = None
        self._decoder = self.decode
        self._ragged = self.ragged

    def _decode_wrapper(self, bucket: int | None = None):
        if bucket is None:
            return self._fi.BatchDecodeWithPagedKVCacheWrapper(
                self.workspace, "NHD", use_tensor_cores=self.decode_tensor_cores)
        # CUDA-graph mode: the wrapper's index arrays live in these fixed buffers, which plan()
        # refills before every replay; the batch size is fixed to the bucket.
        return self._fi.BatchDecodeWithPagedKVCacheWrapper(
            self.workspace, "NHD", use_cuda_graph=True, use_tensor_cores=self.decode_tensor_cores,
            paged_kv_indptr_buffer=torch.zeros(bucket + 1, dtype=torch.int32, device=self.device),
            paged_kv_indices_buffer=torch.zeros(bucket * self.max_pages_per_row, dtype=torch.int32,
                                                device=self.device),
            paged_kv_last_page_len_buffer=torch.zeros(bucket, dtype=torch.int32, device=self.device),
        )

    # -- planning ---------------------------------------------------------------------------
    def plan(self, layout: StepLayout) -> None:
        self.query_starts = layout.query_starts
        self._encoder_planned = False
        plan = build_plan(layout, self.page_size, layout.host_slots)
        self._begin(plan, layout.slot_mapping)
        self._ragged = self.ragged
        if plan.num_prefill_tokens and layout.item_lengths is not None:
            self._plan_masked(layout, plan)
            self._ragged = self.masked
        elif plan.num_prefill_tokens:
            self._plan_ragged(self.ragged, plan)
        if plan.prefix_rows:
            kv = plan.prefix_kv
            self.prefix.plan(_host(plan.prefix_qo_indptr), _host(kv.indptr), _host(kv.indices),
                             _host(kv.last_page_len), self.num_q_heads, self.num_kv_heads,
                             self.head_dim, self.page_size, causal=False,
                             q_data_type=self.dtype, kv_data_type=self.dtype)
            span = plan.prefix_span
            self.prefix_index = None if span else torch.tensor(
                plan.prefix_tokens, dtype=torch.long, device=self.device)
        self._decoder = self.decode
        if plan.num_decode_rows:
            self._plan_decoder(self.decode, plan.decode_kv)

    def bidirectional(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int = 0) -> torch.Tensor:
        """Every row's tokens see one another, through the non-causal ragged prefill. A local
        window narrower than some row goes to torch's attention: flashinfer's window bounds only
        the keys before a query."""
        starts = self.query_starts
        if window and any(end - start > window + 1 for start, end in zip(starts, starts[1:])):
            return bidirectional_attention(q, k, v, starts, window)
        if not self._encoder_planned:
            indptr = _host(starts)
            self.encoder.plan(indptr, indptr, q.shape[1], k.shape[1], q.shape[2], causal=False,
                              q_data_type=q.dtype, kv_data_type=k.dtype)
            self._encoder_planned = True
        return self.encoder.run(_dense(q), _dense(k), _dense(v))

    def plan_graph(self, kind: GraphKind, layout: StepLayout, bucket: int) -> None:
        if kind == "decode":
            self._plan_graph_decode(layout, bucket)
        else:
            self._plan_graph_prefill(layout, bucket)

    def _plan_graph_decode(self, layout: StepLayout, bucket: int) -> None:
        """Plans a pure decode step padded to `bucket` rows on that bucket's graph wrapper.
        layout.slot_mapping must already be the graph's static [bucket] slot buffer."""
        plan = build_plan(layout, self.page_size, layout.host_slots)
        if plan.num_prefill_tokens:
            raise ValueError("only pure decode steps run in CUDA graphs")
        self._begin(plan, layout.slot_mapping)
        wrapper = self.graph_decoders.get(bucket)
        if wrapper is None:
            wrapper = self.graph_decoders[bucket] = self._decode_wrapper(bucket)
        self._plan_decoder(wrapper, pad_decode_rows(plan.decode_kv, bucket, self.dummy_page))
        self._decoder = wrapper
        self._ragged = self.ragged

    def _plan_graph_prefill(self, layout: StepLayout, bucket: int) -> None:
        """Plans prefill rows without cached context, padded to `bucket` tokens and to the
        bucket's fixed row count (the padding tokens a row of their own, the rest empty), on
        that bucket's graph wrapper. Needs the fused KV write: it reads the static slot buffer."""
        plan = build_plan(layout, self.page_size, layout.host_slots)
        if not self.fuses_rope or plan.prefix_rows or plan.num_decode_rows or plan.num_prefill_tokens != bucket:
            raise ValueError("prefill graphs take fresh prefill rows padded to the bucket, with the fused KV write")
        self._begin(plan, layout.slot_mapping)
        wrapper = self.graph_prefills.get(bucket)
        if wrapper is None:
            buffers = {name: torch.zeros(layout.num_rows + 1, dtype=torch.int32, device=self.device)
                       for name in ("qo_indptr_buf", "kv_indptr_buf")}
            wrapper = self._fi.BatchPrefillWithRaggedKVCacheWrapper(
                self.workspace, "NHD", use_cuda_graph=True, backend=PREFILL_BACKEND, **buffers)
            self.graph_prefills[bucket] = wrapper
        self._plan_ragged(wrapper, plan)
        self._ragged = wrapper

    def _plan_ragged(self, wrapper, plan: FlashInferPlan) -> None:
        indptr = _host(plan.ragged_indptr)
        wrapper.plan(indptr, indptr, self.num_q_heads, self.num_kv_heads, self.head_dim,
                     causal=True, q_data_type=self.dtype, kv_data_type=self.dtype)

    def _plan_masked(self, layout: StepLayout, plan: FlashInferPlan) -> None:
        """The prefill rows' own tokens under one mask (own_token_mask: causal for the rows
        without items). The indptr goes on the device with the mask, where flashinfer packs it."""
        items = layout.item_lengths
        assert items is not None
        mask = torch.cat([own_token_mask(layout.query_len(row), items[row], self.device).flatten()
                          for row in range(layout.num_prefill_rows)])
        indptr = torch.tensor(plan.ragged_indptr, dtype=torch.int32, device=self.device)
        self.masked.plan(indptr, indptr, self.num_q_heads, self.num_kv_heads, self.head_dim,
                         custom_mask=mask, q_data_type=self.dtype, kv_data_type=self.dtype)

    def _begin(self, plan: FlashInferPlan, slot_mapping: torch.Tensor) -> None:
        self._plan = plan
        self.slot_mapping = slot_mapping
        if not plan.store_all and not self.fuses_rope:  # the fused write skips slot -1 itself
            self.store_index = torch.tensor(plan.store_tokens, dtype=torch.long, device=self.device)
            self.store_slots = slot_mapping.index_select(0, self.store_index)

    def _plan_decoder(self, wrapper, kv: PagedRows) -> None:
        wrapper.plan(_host(kv.indptr), _host(kv.indices), _host(kv.last_page_len),
                     self.num_q_heads, self.num_kv_heads, self.head_dim, self.page_size,
                     q_data_type=self.dtype, kv_data_type=self.dtype)

    # -- per layer --------------------------------------------------------------------------
    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 rope: tuple[torch.Tensor, torch.Tensor] | None = None,
                 qk_norm: QKNorm | None = None) -> torch.Tensor:
        plan = self._plan
        assert plan is not None, "plan() or plan_graph() runs before the layers"
        if rope is not None:
            q, k = self.store(layer, q, k, v, rope, qk_norm, self.slot_mapping)
        else:
            self._store(plan, k, v, *self.kv_cache.layer(layer))
        return self.attend(layer, q, k, v)

    def store(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              rope: tuple[torch.Tensor, torch.Tensor], qk_norm: QKNorm | None,
              slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        from kernels.rope import rope_kv_write

        k_cache, v_cache = self.kv_cache.layer(layer)
        q_norm, k_norm, eps = qk_norm if qk_norm is not None else (None, None, 1e-6)
        return rope_kv_write(q, k, v, rope[0], rope[1], k_cache, v_cache, slots, q_norm, k_norm, eps)

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        plan = self._plan
        assert plan is not None, "plan() or plan_graph() runs before the layers"
        k_cache, v_cache = self.kv_cache.layer(layer)
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        num_prefill = plan.num_prefill_tokens
        if num_prefill:
            self._prefill(plan, _dense(q[:num_prefill]), _dense(k[:num_prefill]), _dense(v[:num_prefill]),
                          out[:num_prefill], (k_cache, v_cache))
        if num_prefill < q.shape[0]:
            self._decoder.run(_dense(q[num_prefill:]), (k_cache, v_cache), out=out[num_prefill:])
        return out

    def _store(self, plan: FlashInferPlan, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
               v_cache: torch.Tensor) -> None:
        flat_k = k_cache.view(-1, self.num_kv_heads, self.head_dim)
        flat_v = v_cache.view(-1, self.num_kv_heads, self.head_dim)
        if plan.store_all:
            flat_k.index_copy_(0, self.slot_mapping, k)
            flat_v.index_copy_(0, self.slot_mapping, v)
        elif plan.store_tokens:
            flat_k.index_copy_(0, self.store_slots, k.index_select(0, self.store_index))
            flat_v.index_copy_(0, self.store_slots, v.index_select(0, self.store_index))

    def _prefill(self, plan: FlashInferPlan, q, k, v, out: torch.Tensor, kv_cache) -> None:
        if not plan.prefix_rows:
            self._ragged.run(q, k, v, out=out)
            return
        _, lse = self._ragged.run(q, k, v, out=out, return_lse=True)
        span = plan.prefix_span
        if span:
            o_ctx, lse_ctx = self.prefix.run(q[span[0]:span[1]], kv_cache, return_lse=True)
            # Slices of `out`/`lse`: the merge writes the final values in place.
            self._fi.merge_state_in_place(out[span[0]:span[1]], lse[span[0]:span[1]], o_ctx, lse_ctx)
            return
        index = self.prefix_index
        assert index is not None, "plan() indexes the prefix rows' tokens when they are not one span"
        o_ctx, lse_ctx = self.prefix.run(q.index_select(0, index), kv_cache, return_lse=True)
        o_own = out.index_select(0, index)
        self._fi.merge_state_in_place(o_own, lse.index_select(0, index), o_ctx, lse_ctx)
        out.index_copy_(0, index, o_own)


def _dense(x: torch.Tensor) -> torch.Tensor:
    # The kernels index rows by the tensor's strides, but a plain contiguous tensor is the one
    # layout every flashinfer version accepts; q and k are already dense on the fused path.
    return x if x.is_contiguous() else x.contiguous()
