"""A CPU stand-in for the slice of flashinfer's Python API the backend uses. Its signatures are
flashinfer-python 0.6.6's, parameter for parameter (prefill.py, decode.py, cascade.py;
test_fake_flashinfer checks them against the installed flashinfer's source), and it makes the
checks 0.6.6 makes in Python before a kernel runs (CUDA-graph buffers, fixed batch sizes, plan
vs run dtypes, out/lse shapes, the custom mask on its indptr's device, contiguous merge inputs).
Parameters it does not emulate must keep their defaults, so what it computes is what the kernel
would: NHD paged layout, CSR page tables with last_page_len in 1..page_size, causal masks aligned
to the end of each row's KV, base-2 log-sum-exp. It says nothing about the kernels themselves,
which only the CUDA tests check."""
from __future__ import annotations

import importlib
import inspect
import sys
import types

import torch

from tests.executor import fake_flashinfer_base as base
from tests.executor.fake_flashinfer_base import _attend, _check_index, _check_out, _defaults, _finish, _mirrors


class BatchPrefillWithRaggedKVCacheWrapper(base._Wrapper):
    @_mirrors
    def __init__(self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False, qo_indptr_buf=None,
                 kv_indptr_buf=None, custom_mask_buf=None, mask_indptr_buf=None, backend="auto",
                 jit_args=None, jit_kwargs=None):
        self._setup(float_workspace_buffer, kv_layout, backend)
        _defaults(jit_args=jit_args, jit_kwargs=jit_kwargs)
        self.use_cuda_graph = use_cuda_graph
        self.has_mask_bufs = custom_mask_buf is not None and mask_indptr_buf is not None
        if use_cuda_graph:
            base._graph_buffers(qo_indptr_buf=qo_indptr_buf, kv_indptr_buf=kv_indptr_buf)
            self.fixed_batch = len(qo_indptr_buf) - 1
            assert len(kv_indptr_buf) == self.fixed_batch + 1

    @_mirrors
    def plan(self, qo_indptr, kv_indptr, num_qo_heads, num_kv_heads, head_dim_qk, head_dim_vo=None,
             custom_mask=None, packed_custom_mask=None, causal=False, pos_encoding_mode="NONE",
             use_fp16_qk_reduction=False, window_left=-1, logits_soft_cap=None, sm_scale=None,
             rope_scale=None, rope_theta=None, q_data_type="float16", kv_data_type=None, o_data_type=None,
             non_blocking=True, prefix_len_ptr=None, token_pos_in_items_ptr=None, token_pos_in_items_len=0,
             max_item_len_ptr=None, fixed_split_size=None, disable_split_kv=False, seq_lens=None,
             seq_lens_q=None, max_token_per_sequence=None, max_sequence_kv=None, v_indptr=None,
             o_indptr=None):
        _defaults(head_dim_vo=head_dim_vo, pos_encoding_mode=pos_encoding_mode,
                  use_fp16_qk_reduction=use_fp16_qk_reduction, window_left=window_left,
                  logits_soft_cap=logits_soft_cap, sm_scale=sm_scale, o_data_type=o_data_type,
                  prefix_len_ptr=prefix_len_ptr, token_pos_in_items_ptr=token_pos_in_items_ptr,
                  max_item_len_ptr=max_item_len_ptr, seq_lens=seq_lens, seq_lens_q=seq_lens_q,
                  v_indptr=v_indptr, o_indptr=o_indptr)
        self.qo = _check_index(qo_indptr, "qo_indptr")
        self.kv = _check_index(kv_indptr, "kv_indptr")
        assert len(self.qo) == len(self.kv), "The kv_indptr length should be equal to mask_indptr length."
        assert packed_custom_mask is None, "the backend hands flashinfer the unpacked mask"
        if self.use_cuda_graph:
            self._graph_rows(self.qo[-1], len(self.qo) - 1)
            assert custom_mask is None or self.has_mask_bufs, "custom_mask_buf must be initialized"
        # This wrapper keeps the custom mask of an earlier plan when a later one has none, and
        # would apply that stale mask: a wrapper that was ever masked is for masks only.
        assert custom_mask is not None or not getattr(self, "masks", None), "a masked wrapper kept for masks"
        self.masks = None if custom_mask is None else self._split_mask(custom_mask, qo_indptr)
        self.causal = causal
        self._planned(q_data_type, kv_data_type, num_qo_heads)

    def _split_mask(self, mask: torch.Tensor, qo_indptr: torch.Tensor) -> list[torch.Tensor]:
        """The flattened custom mask as each row's [qo_len, kv_len], row-major (flashinfer's
        layout). plan() packs it with segment_packbits over an indptr computed where qo_indptr
        is; that kernel requires both on one (CUDA) device."""
        assert mask.dtype == torch.bool and mask.dim() == 1 and mask.device == qo_indptr.device
        sizes = [(b - a) * (d - c) for a, b, c, d in zip(self.qo, self.qo[1:], self.kv, self.kv[1:])]
        assert len(mask) == sum(sizes), (len(mask), sum(sizes))
        rows = mask.split(sizes)
        return [m.view(b - a, d - c) for m, a, b, c, d in zip(rows, self.qo, self.qo[1:], self.kv, self.kv[1:])]

    @_mirrors
    def run(self, q, k, v, *args, q_scale=None, k_scale=None, v_scale=None, o_scale=None, out=None,
            lse=None, return_lse=False, enable_pdl=None):
        _defaults(args=args, q_scale=q_scale, k_scale=k_scale, v_scale=v_scale, o_scale=o_scale)
        self._check_run(q, k)
        _check_out(out, lse, q.shape[:-1] + v.shape[-1:], self.dtype, q, return_lse)
        assert q.shape[0] == self.qo[-1] and k.shape[0] == self.kv[-1] == v.shape[0]
        outs, lses = [], []
        for row in range(len(self.qo) - 1):
            qs, ks = slice(self.qo[row], self.qo[row + 1]), slice(self.kv[row], self.kv[row + 1])
            o, s = _attend(q[qs], k[ks], v[ks], self.causal, None if self.masks is None else self.masks[row])
            outs.append(o), lses.append(s)
        return _finish(outs, lses, q, out, return_lse)


class BatchPrefillWithPagedKVCacheWrapper(base._Wrapper):
    @_mirrors
    def __init__(self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False, qo_indptr_buf=None,
                 paged_kv_indptr_buf=None, paged_kv_indices_buf=None, paged_kv_last_page_len_buf=None,
                 custom_mask_buf=None, mask_indptr_buf=None, backend="auto", jit_args=None, jit_kwargs=None):
        self._setup(float_workspace_buffer, kv_layout, backend)
        _defaults(use_cuda_graph=use_cuda_graph, custom_mask_buf=custom_mask_buf, jit_args=jit_args,
                  jit_kwargs=jit_kwargs)

    @_mirrors
    def plan(self, qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, num_qo_heads,
             num_kv_heads, head_dim_qk, page_size, head_dim_vo=None, custom_mask=None,
             packed_custom_mask=None, causal=False, pos_encoding_mode="NONE", use_fp16_qk_reduction=False,
             sm_scale=None, window_left=-1, logits_soft_cap=None, rope_scale=None, rope_theta=None,
             q_data_type="float16", kv_data_type=None, o_data_type=None, non_blocking=True,
             prefix_len_ptr=None, token_pos_in_items_ptr=None, token_pos_in_items_len=0,
             max_item_len_ptr=None, seq_lens=None, seq_lens_q=None, block_tables=None,
             max_token_per_sequence=None, max_sequence_kv=None, fixed_split_size=None,
             disable_split_kv=False):
        _defaults(head_dim_vo=head_dim_vo, custom_mask=custom_mask, packed_custom_mask=packed_custom_mask,
                  pos_encoding_mode=pos_encoding_mode, use_fp16_qk_reduction=use_fp16_qk_reduction,
                  sm_scale=sm_scale, window_left=window_left, logits_soft_cap=logits_soft_cap,
                  o_data_type=o_data_type, prefix_len_ptr=prefix_len_ptr, seq_lens=seq_lens,
                  block_tables=block_tables, max_token_per_sequence=max_token_per_sequence,
                  max_sequence_kv=max_sequence_kv)
        self.qo = _check_index(qo_indptr, "qo_indptr")
        self._check_pages(paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, page_size)
        assert len(self.qo) == len(self.indptr)
        self.causal = causal
        self._planned(q_data_type, kv_data_type, num_qo_heads)

    @_mirrors
    def run(self, q, paged_kv_cache, *args, q_scale=None, k_scale=None, v_scale=None, out=None, lse=None,
            return_lse=False, enable_pdl=None, window_left=None, sinks=None,
            skip_softmax_threshold_scale_factor=None):
        _defaults(args=args, q_scale=q_scale, k_scale=k_scale, v_scale=v_scale, sinks=sinks,
                  skip_softmax_threshold_scale_factor=skip_softmax_threshold_scale_factor)
        assert window_left in (None, -1), "run()'s window_left must be plan()'s"
        k_cache, v_cache = self._cache(paged_kv_cache)
        self._check_run(q, k_cache)
        _check_out(out, lse, q.shape[:-1] + v_cache.shape[-1:], self.dtype, q, return_lse)
        assert q.shape[0] == self.qo[-1]
        outs, lses = [], []
        for row in range(len(self.qo) - 1):
            k, v = self._gather_pages(k_cache, v_cache, row)
            o, s = _attend(q[self.qo[row]:self.qo[row + 1]], k, v, self.causal)
            outs.append(o), lses.append(s)
        return _finish(outs, lses, q, out, return_lse)


class BatchDecodeWithPagedKVCacheWrapper(base._Wrapper):
    @_mirrors
    def __init__(self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False, use_tensor_cores=False,
                 paged_kv_indptr_buffer=None, paged_kv_indices_buffer=None, paged_kv_last_page_len_buffer=None,
                 backend="auto", jit_args=None):
        self._setup(float_workspace_buffer, kv_layout, backend)
        _defaults(jit_args=jit_args)
        self.use_cuda_graph, self.use_tensor_cores = use_cuda_graph, use_tensor_cores
        if use_cuda_graph:
            base._graph_buffers(paged_kv_indptr_buffer=paged_kv_indptr_buffer,
                                paged_kv_indices_buffer=paged_kv_indices_buffer,
                                paged_kv_last_page_len_buffer=paged_kv_last_page_len_buffer)
            self.fixed_batch = len(paged_kv_last_page_len_buffer)
            assert len(paged_kv_indptr_buffer) == self.fixed_batch + 1, "paged_kv_indptr_buffer: batch_size + 1"
            self.indices_capacity = len(paged_kv_indices_buffer)

    @_mirrors
    def plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size,
             pos_encoding_mode="NONE", window_left=-1, logits_soft_cap=None, q_data_type="float16",
             kv_data_type=None, o_data_type=None, data_type=None, sm_scale=None, rope_scale=None,
             rope_theta=None, non_blocking=True, block_tables=None, seq_lens=None, fixed_split_size=None,
             disable_split_kv=False):
        _defaults(pos_encoding_mode=pos_encoding_mode, window_left=window_left, logits_soft_cap=logits_soft_cap,
                  o_data_type=o_data_type, data_type=data_type, sm_scale=sm_scale, block_tables=block_tables,
                  seq_lens=seq_lens, fixed_split_size=fixed_split_size)
        self._check_pages(indptr, indices, last_page_len, page_size)
        # The CUDA-core decode kernel is instantiated for these query heads per KV head only
        # (utils.cuh DISPATCH_GQA_GROUP_SIZE); the tensor-core one takes any.
        group = num_qo_heads // num_kv_heads
        assert self.use_tensor_cores or group in (1, 2, 3, 4, 8), f"Unsupported group_size: {group}"
        if self.use_cuda_graph:
            assert len(self.last) == self.fixed_batch, "The batch size should be fixed in cudagraph mode"
            assert len(self.indices) <= self.indices_capacity, "indices exceed the allocated buffer"
        self._planned(q_data_type, kv_data_type, num_qo_heads)

    @_mirrors
    def run(self, q, paged_kv_cache, *args, q_scale=None, k_scale=None, v_scale=None, out=None, lse=None,
            return_lse=False, enable_pdl=None, window_left=None, sinks=None, q_len_per_req=1,
            skip_softmax_threshold_scale_factor=None):
        _defaults(args=args, q_scale=q_scale, k_scale=k_scale, v_scale=v_scale, sinks=sinks,
                  skip_softmax_threshold_scale_factor=skip_softmax_threshold_scale_factor)
        assert window_left in (None, -1) and q_len_per_req == 1
        k_cache, v_cache = self._cache(paged_kv_cache)
        self._check_run(q, k_cache)
        _check_out(out, lse, q.shape, self.dtype, q, return_lse)
        assert q.shape[0] == len(self.last)
        outs, lses = [], []
        for row in range(len(self.last)):
            k, v = self._gather_pages(k_cache, v_cache, row)
            o, s = _attend(q[row:row + 1], k, v, causal=False)
            outs.append(o), lses.append(s)
        return _finish(outs, lses, q, out, return_lse)


def merge_state_in_place(v, s, v_other, s_other, mask=None):
    """(v, s) <- merge of the two partial states; s in base 2. cascade.merge_state_in_place's
    kernel takes contiguous [n, H, D] / [n, H] float32 tensors and writes v and s in place."""
    if base._REAL is not None:
        inspect.signature(base._REAL.merge_state_in_place).bind(v, s, v_other, s_other, mask)
    assert mask is None
    for t in (v, s, v_other, s_other):
        assert t.is_contiguous(), "merge_state_in_place takes contiguous tensors"
    assert v.dim() == 3 and s.dim() == 2 and v.shape == v_other.shape and s.shape == s_other.shape
    assert v.shape[:2] == s.shape and s.dtype == s_other.dtype == torch.float32
    m = torch.maximum(s, s_other)
    wa, wb = torch.exp2(s - m), torch.exp2(s_other - m)
    merged = (v.float() * wa[..., None] + v_other.float() * wb[..., None]) / (wa + wb)[..., None]
    v.copy_(merged.to(v.dtype))
    s.copy_(m + torch.log2(wa + wb))


def install(monkeypatch) -> types.ModuleType:
    """Makes `import flashinfer` return this module for the duration of a test."""
    try:
        real = importlib.import_module("flashinfer")
    except Exception:  # absent (CI) or unusable here: calls are then checked by the fake alone
        real = None
    module = sys.modules[__name__]
    monkeypatch.setattr(base, "_REAL", real if real is not module else None)
    monkeypatch.setitem(sys.modules, "flashinfer", module)
    return module
