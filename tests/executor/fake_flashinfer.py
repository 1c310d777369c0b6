"""A CPU stand-in for the slice of flashinfer's Python API the backend uses, written from the
documented semantics (NHD paged layout, CSR page tables with last_page_len in 1..page_size,
causal masks aligned to the end of each row's KV, log-sum-exp merging). It validates its
arguments the way the real wrappers do, so the backend's planning is exercised on CPU; it
says nothing about the real kernels, which only the CUDA tests check.

When the real flashinfer is importable (the GPU image, or a CPU machine with the wheel
installed), every call is also bound against the real method's signature, so an argument the
installed version does not take fails here rather than on the device."""
from __future__ import annotations

import functools
import importlib
import inspect
import math
import sys
import types

import torch

LOG2E = math.log2(math.e)
_REAL: types.ModuleType | None = None  # the real flashinfer, while install() has one


def _mirrors(method):
    """Binds each call against the real flashinfer method of the same class and name."""

    @functools.wraps(method)
    def checked(self, *args, **kwargs):
        if _REAL is not None:
            real = getattr(getattr(_REAL, type(self).__name__), method.__name__)
            inspect.signature(real).bind(self, *args, **kwargs)
        return method(self, *args, **kwargs)

    return checked


def _check_index(t: torch.Tensor, name: str) -> list[int]:
    assert isinstance(t, torch.Tensor) and t.dtype == torch.int32, f"{name} must be an int32 tensor"
    assert t.dim() == 1, f"{name} must be 1-D"
    return t.tolist()


def _attend(q, k, v, causal: bool, mask: torch.Tensor | None = None):
    """q: [n, H, D]; k, v: [m, Hkv, D] -> (out [n, H, D], lse [n, H] in base 2, as flashinfer).
    `mask` ([n, m], True: attends) replaces the causal one, as a custom mask does."""
    n, m, heads = q.shape[0], k.shape[0], q.shape[1]
    group = heads // k.shape[1]
    kf = k.float().repeat_interleave(group, dim=1)
    vf = v.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("nhd,mhd->hnm", q.float(), kf) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    elif causal:
        # Query i sits at KV position m - n + i.
        allowed = torch.arange(m)[None, :] <= (m - n + torch.arange(n))[:, None]
        scores = scores.masked_fill(~allowed, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # [H, n]
    out = torch.einsum("hnm,mhd->nhd", torch.softmax(scores, dim=-1), vf)
    return out, (lse * LOG2E).transpose(0, 1).contiguous()


def _finish(out_rows, lse_rows, q, out, return_lse):
    result = torch.cat(out_rows).to(q.dtype) if out_rows else q.new_empty(q.shape)
    if out is not None:
        assert out.shape == q.shape and out.dtype == q.dtype
        out.copy_(result)
        result = out
    lse = torch.cat(lse_rows) if lse_rows else torch.empty(q.shape[:2])
    return (result, lse) if return_lse else result


class _Wrapper:
    @_mirrors
    def __init__(self, float_workspace_buffer, kv_layout="NHD", **kwargs):
        assert kv_layout == "NHD"
        self.planned = False
        self.plan_calls = 0

    def _gather_pages(self, paged_kv_cache, row):
        k_cache, v_cache = paged_kv_cache
        pages = self.indices[self.indptr[row]:self.indptr[row + 1]]
        length = (len(pages) - 1) * self.page_size + self.last[row]
        return (k_cache[pages].flatten(0, 1)[:length], v_cache[pages].flatten(0, 1)[:length])

    def _check_pages(self, indptr, indices, last, page_size):
        self.indptr = _check_index(indptr, "indptr")
        self.indices = _check_index(indices, "indices")
        self.last = _check_index(last, "last_page_len")
        assert self.indptr[0] == 0 and self.indptr[-1] == len(self.indices)
        assert len(self.indptr) == len(self.last) + 1
        assert all(1 <= n <= page_size for n in self.last), self.last
        assert all(b - a >= 1 for a, b in zip(self.indptr, self.indptr[1:])), "empty KV row"
        self.page_size = page_size


class BatchPrefillWithRaggedKVCacheWrapper(_Wrapper):
    @_mirrors
    def plan(self, qo_indptr, kv_indptr, num_qo_heads, num_kv_heads, head_dim_qk, head_dim_vo=None,
             custom_mask=None, packed_custom_mask=None, causal=False, *, q_data_type="float16",
             kv_data_type=None, **kwargs):
        self.qo = _check_index(qo_indptr, "qo_indptr")
        self.kv = _check_index(kv_indptr, "kv_indptr")
        assert len(self.qo) == len(self.kv)
        assert packed_custom_mask is None, "the backend hands flashinfer the unpacked mask"
        # flashinfer keeps the custom mask of a wrapper's earlier plan when a later one has none.
        assert custom_mask is not None or not getattr(self, "masks", None), "a masked wrapper kept for masks"
        self.masks = None if custom_mask is None else self._split_mask(custom_mask, qo_indptr)
        self.causal, self.dtype, self.heads = causal, q_data_type, num_qo_heads
        self.planned = True
        self.plan_calls += 1

    def _split_mask(self, mask: torch.Tensor, qo_indptr: torch.Tensor) -> list[torch.Tensor]:
        """The flattened custom mask as each row's [qo_len, kv_len], row-major (flashinfer's
        layout). flashinfer packs it where the mask and the indptr are: they must share a device."""
        assert mask.dtype == torch.bool and mask.dim() == 1 and mask.device == qo_indptr.device
        sizes = [(b - a) * (d - c) for a, b, c, d in zip(self.qo, self.qo[1:], self.kv, self.kv[1:])]
        assert len(mask) == sum(sizes), (len(mask), sum(sizes))
        rows = mask.split(sizes)
        return [m.view(b - a, d - c) for m, a, b, c, d in zip(rows, self.qo, self.qo[1:], self.kv, self.kv[1:])]

    @_mirrors
    def run(self, q, k, v, *, out=None, lse=None, return_lse=False):
        assert self.planned and q.dtype == self.dtype and q.shape[1] == self.heads
        assert q.shape[0] == self.qo[-1] and k.shape[0] == self.kv[-1] == v.shape[0]
        outs, lses = [], []
        for row in range(len(self.qo) - 1):
            qs, ks = slice(self.qo[row], self.qo[row + 1]), slice(self.kv[row], self.kv[row + 1])
            o, s = _attend(q[qs], k[ks], v[ks], self.causal, None if self.masks is None else self.masks[row])
            outs.append(o), lses.append(s)
        return _finish(outs, lses, q, out, return_lse)


class BatchPrefillWithPagedKVCacheWrapper(_Wrapper):
    @_mirrors
    def plan(self, qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len,
             num_qo_heads, num_kv_heads, head_dim_qk, page_size, head_dim_vo=None,
             custom_mask=None, packed_custom_mask=None, causal=False, *, q_data_type="float16",
             kv_data_type=None, **kwargs):
        self.qo = _check_index(qo_indptr, "qo_indptr")
        self._check_pages(paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, page_size)
        assert len(self.qo) == len(self.indptr)
        self.causal, self.dtype, self.heads = causal, q_data_type, num_qo_heads
        self.planned = True
        self.plan_calls += 1

    @_mirrors
    def run(self, q, paged_kv_cache, *, out=None, lse=None, return_lse=False):
        assert self.planned and q.dtype == self.dtype and q.shape[0] == self.qo[-1]
        outs, lses = [], []
        for row in range(len(self.qo) - 1):
            k, v = self._gather_pages(paged_kv_cache, row)
            o, s = _attend(q[self.qo[row]:self.qo[row + 1]], k, v, self.causal)
            outs.append(o), lses.append(s)
        return _finish(outs, lses, q, out, return_lse)


class BatchDecodeWithPagedKVCacheWrapper(_Wrapper):
    @_mirrors
    def __init__(self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False,
                 use_tensor_cores=False, paged_kv_indptr_buffer=None, paged_kv_indices_buffer=None,
                 paged_kv_last_page_len_buffer=None, **kwargs):
        _Wrapper.__init__.__wrapped__(self, float_workspace_buffer, kv_layout)
        self.use_cuda_graph = use_cuda_graph
        if use_cuda_graph:
            assert len(paged_kv_indptr_buffer) == len(paged_kv_last_page_len_buffer) + 1
            self.fixed_batch = len(paged_kv_last_page_len_buffer)
            self.indices_capacity = len(paged_kv_indices_buffer)

    @_mirrors
    def plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size,
             *positional, q_data_type="float16", kv_data_type=None, **kwargs):
        assert not positional, "optional plan() arguments must be keywords"
        self._check_pages(indptr, indices, last_page_len, page_size)
        if self.use_cuda_graph:
            assert len(self.last) == self.fixed_batch, "batch size is fixed in cudagraph mode"
            assert len(self.indices) <= self.indices_capacity
        self.dtype, self.heads = q_data_type, num_qo_heads
        self.planned = True
        self.plan_calls += 1

    @_mirrors
    def run(self, q, paged_kv_cache, *, out=None, lse=None, return_lse=False):
        assert self.planned and q.dtype == self.dtype and q.shape[0] == len(self.last)
        outs, lses = [], []
        for row in range(len(self.last)):
            k, v = self._gather_pages(paged_kv_cache, row)
            o, s = _attend(q[row:row + 1], k, v, causal=False)
            outs.append(o), lses.append(s)
        return _finish(outs, lses, q, out, return_lse)


def merge_state_in_place(v, s, v_other, s_other, mask=None):
    """(v, s) <- merge of the two partial states; s in base 2."""
    if _REAL is not None:
        inspect.signature(_REAL.merge_state_in_place).bind(v, s, v_other, s_other, mask)
    m = torch.maximum(s, s_other)
    wa, wb = torch.exp2(s - m), torch.exp2(s_other - m)
    merged = (v.float() * wa[..., None] + v_other.float() * wb[..., None]) / (wa + wb)[..., None]
    v.copy_(merged.to(v.dtype))
    s.copy_(m + torch.log2(wa + wb))


def install(monkeypatch) -> types.ModuleType:
    """Makes `import flashinfer` return this module for the duration of a test."""
    global _REAL
    try:
        real = importlib.import_module("flashinfer")
    except Exception:  # absent (CI) or unusable here: calls are then checked by the fake alone
        real = None
    module = sys.modules[__name__]
    monkeypatch.setattr(module, "_REAL", real if real is not module else None)
    monkeypatch.setitem(sys.modules, "flashinfer", module)
    return module
