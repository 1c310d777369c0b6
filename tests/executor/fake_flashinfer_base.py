"""The parts of fake_flashinfer (the CPU stand-in for flashinfer's API) that are not API:
the reference attention, the checks 0.6.6 makes in Python before its kernels run, and the binding
against the real methods when flashinfer is importable."""
from __future__ import annotations

import functools
import inspect
import math
import types

import torch

LOG2E = math.log2(math.e)
_REAL: types.ModuleType | None = None  # the real flashinfer, while fake_flashinfer.install() has one
_LAYOUTS = ("NHD", "HND")


def _mirrors(method):
    """Binds each call against the real flashinfer method of the same class and name."""

    @functools.wraps(method)
    def checked(self, *args, **kwargs):
        if _REAL is not None:
            real = getattr(getattr(_REAL, type(self).__name__), method.__name__)
            inspect.signature(real).bind(self, *args, **kwargs)
        return method(self, *args, **kwargs)

    return checked


def _dtype(dtype) -> torch.dtype:
    # utils.canonicalize_torch_dtype: plan() takes a torch.dtype or its name.
    if isinstance(dtype, str):
        return getattr(torch, dtype)
    assert isinstance(dtype, torch.dtype), f"dtype must be a string or torch.dtype, got {type(dtype)}"
    return dtype


def _defaults(**unemulated) -> None:
    """The stand-in computes plain softmax attention: a non-default knob would change results."""
    plain = {"pos_encoding_mode": "NONE", "window_left": -1, "use_fp16_qk_reduction": False}
    for name, value in unemulated.items():
        if name in plain:
            assert value == plain[name], (name, value)
        else:
            assert value is None or value is False or value == (), (name, value)


def _check_index(t: torch.Tensor, name: str) -> list[int]:
    assert isinstance(t, torch.Tensor) and t.dtype == torch.int32, f"{name} must be an int32 tensor"
    assert t.dim() == 1, f"{name} must be 1-D"
    return t.tolist()


def _check_out(out, lse, shape, dtype, q, return_lse) -> None:
    # utils.check_shape_dtype_device, as run() applies it to `out` and `lse`.
    if out is not None:
        assert out.shape == shape and out.dtype == dtype and out.device == q.device, (out.shape, shape)
    if lse is not None and return_lse:
        assert lse.shape == q.shape[:2] and lse.dtype == torch.float32


def _attend(q, k, v, causal: bool, mask: torch.Tensor | None = None):
    """q: [n, H, D]; k, v: [m, Hkv, D] -> (out [n, H, D], lse [n, H] in base 2, as flashinfer).
    `mask` ([n, m], True: attends) replaces the causal one, as a custom mask does."""
    n, m, heads = q.shape[0], k.shape[0], q.shape[1]
    assert heads % k.shape[1] == 0, "num_qo_heads must be a multiple of num_kv_heads"
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
        out.copy_(result)
        result = out
    lse = torch.cat(lse_rows) if lse_rows else torch.empty(q.shape[:2])
    return (result, lse) if return_lse else result


class _Wrapper:
    def _setup(self, float_workspace_buffer, kv_layout, backend) -> None:
        assert kv_layout in _LAYOUTS, f"Invalid kv_layout {kv_layout}"
        assert kv_layout == "NHD", "the stand-in reads the NHD layout only"
        assert backend in ("auto", "fa2", "fa3", "cudnn", "cutlass", "trtllm-gen"), backend
        self.device = float_workspace_buffer.device
        self.planned = False
        self.plan_calls = 0
        self.max_total_rows: int | None = None

    def _planned(self, q_data_type, kv_data_type, num_qo_heads) -> None:
        self.dtype = _dtype(q_data_type)
        self.kv_dtype = self.dtype if kv_data_type is None else _dtype(kv_data_type)
        self.heads = num_qo_heads
        self.planned = True
        self.plan_calls += 1

    def _check_run(self, q, k) -> None:
        # utils._check_cached_qkv_data_type
        assert self.planned, "plan() runs before run()"
        assert q.dtype == self.dtype, f"q is {q.dtype}, plan() said {self.dtype}"
        assert k.dtype == self.kv_dtype, f"k is {k.dtype}, plan() said {self.kv_dtype}"
        assert q.shape[1] == self.heads

    def _graph_rows(self, total_rows: int, batch_size: int) -> None:
        # plan() in CUDA-graph mode: the first plan fixes the token count's upper bound.
        if self.max_total_rows is None:
            self.max_total_rows = total_rows
        assert total_rows <= self.max_total_rows, "more rows than the first plan in cuda graph mode"
        assert batch_size == self.fixed_batch, "The batch size should be fixed in cudagraph mode"

    def _check_pages(self, indptr, indices, last, page_size):
        self.indptr = _check_index(indptr, "indptr")
        self.indices = _check_index(indices, "indices")
        self.last = _check_index(last, "last_page_len")
        assert self.indptr[0] == 0 and self.indptr[-1] == len(self.indices)
        assert len(self.indptr) == len(self.last) + 1
        assert all(1 <= n <= page_size for n in self.last), self.last
        assert all(b - a >= 1 for a, b in zip(self.indptr, self.indptr[1:])), "empty KV row"
        self.page_size = page_size

    def _cache(self, paged_kv_cache):
        """utils._unpack_paged_kv_cache for the (k_cache, v_cache) form; run() takes the page
        size from the cache's shape, so it must be the one plan() was given."""
        assert isinstance(paged_kv_cache, tuple), "the backend passes (k_cache, v_cache)"
        k_cache, v_cache = paged_kv_cache
        assert k_cache.dim() == 4 and k_cache.shape == v_cache.shape, "NHD: [pages, page_size, heads, dim]"
        assert k_cache.stride() == v_cache.stride(), "k_page_stride == v_page_stride"
        assert k_cache.shape[1] == self.page_size, (k_cache.shape, self.page_size)
        return k_cache, v_cache

    def _gather_pages(self, k_cache, v_cache, row):
        pages = self.indices[self.indptr[row]:self.indptr[row + 1]]
        length = (len(pages) - 1) * self.page_size + self.last[row]
        return (k_cache[pages].flatten(0, 1)[:length], v_cache[pages].flatten(0, 1)[:length])


def _graph_buffers(**buffers) -> None:
    for name, buf in buffers.items():
        assert torch.is_tensor(buf), f"{name} should be a torch.Tensor in cuda graph mode"
