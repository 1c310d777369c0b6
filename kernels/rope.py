"""Per-head q/k RMSNorm (Qwen3), neox RoPE and the paged KV write in one kernel.

Two programs handle one token: one normalizes, rotates and writes all its query heads to the
contiguous q output; the other does its key heads, writes them to the k output and, with its
value heads, into the paged cache at the token's slot (-1: the token is not stored). Programs
of one head each were too small to keep an H200 busy, a large share of a prompt step's GPU time
(`python -m bench.serving.gpu_profile`). On a decode step this replaces five launches per
layer (two norms, two rotations, the cache write) with one. Rounding follows layers.RMSNorm and
layers._rotate step by step.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _norm_rotate(src, stride_h, dst, w_ptr, cos, sin, eps, heads,
                 HEADS: tl.constexpr, HALF: tl.constexpr, HAS_NORM: tl.constexpr):
    """Loads one token's `heads` heads ([HEADS, HALF] halves, rows past `heads` masked) from
    src, normalizes (HAS_NORM) and rotates each, stores them at dst (contiguous heads) and
    returns them for the cache write."""
    h = tl.arange(0, HEADS)[:, None]
    d = tl.arange(0, HALF)[None, :]
    mask = (h < heads) & (d < HALF)
    x1 = tl.load(src + h * stride_h + d, mask=mask, other=0.0)
    x2 = tl.load(src + h * stride_h + HALF + d, mask=mask, other=0.0)
    dtype = x1.dtype
    f1 = x1.to(tl.float32)
    f2 = x2.to(tl.float32)
    if HAS_NORM:
        inv = tl.rsqrt((tl.sum(f1 * f1, axis=1) + tl.sum(f2 * f2, axis=1)) / (2 * HALF) + eps)[:, None]
        w1 = tl.load(w_ptr + d).to(tl.float32)
        w2 = tl.load(w_ptr + HALF + d).to(tl.float32)
        f1 = (w1 * (f1 * inv).to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
        f2 = (w2 * (f2 * inv).to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
    a = (f1 * cos).to(dtype).to(tl.float32)
    b = (f2 * sin).to(dtype).to(tl.float32)
    c = (f2 * cos).to(dtype).to(tl.float32)
    e = (f1 * sin).to(dtype).to(tl.float32)
    o1 = (a - b).to(dtype)
    o2 = (c + e).to(dtype)
    tl.store(dst + h * (2 * HALF) + d, o1, mask=mask)
    tl.store(dst + h * (2 * HALF) + HALF + d, o2, mask=mask)
    return o1, o2


@triton.jit
def _rope_kv_kernel(
    q_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr, qn_ptr, kn_ptr,
    q_out_ptr, k_out_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
    q_stride_t, q_stride_h, k_stride_t, k_stride_h, v_stride_t, v_stride_h,
    cos_stride, sin_stride, num_q_heads, num_kv_heads, eps,
    Q_HEADS: tl.constexpr, KV_HEADS: tl.constexpr, HALF: tl.constexpr, HAS_NORM: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    d = tl.arange(0, HALF)[None, :]
    cos = tl.load(cos_ptr + t * cos_stride + d).to(tl.float32)
    sin = tl.load(sin_ptr + t * sin_stride + d).to(tl.float32)
    if tl.program_id(1) == 0:
        _norm_rotate(q_ptr + t * q_stride_t, q_stride_h, q_out_ptr + t * num_q_heads * (2 * HALF), qn_ptr,
                     cos, sin, eps, num_q_heads, Q_HEADS, HALF, HAS_NORM)
    else:
        o1, o2 = _norm_rotate(k_ptr + t * k_stride_t, k_stride_h, k_out_ptr + t * num_kv_heads * (2 * HALF),
                              kn_ptr, cos, sin, eps, num_kv_heads, KV_HEADS, HALF, HAS_NORM)
        slot = tl.load(slot_ptr + t).to(tl.int64)
        if slot >= 0:
            h = tl.arange(0, KV_HEADS)[:, None]
            mask = (h < num_kv_heads) & (d < HALF)
            cache = (slot * num_kv_heads + h) * (2 * HALF) + d
            tl.store(k_cache_ptr + cache, o1, mask=mask)
            tl.store(k_cache_ptr + cache + HALF, o2, mask=mask)
            vsrc = v_ptr + t * v_stride_t + h * v_stride_h + d
            tl.store(v_cache_ptr + cache, tl.load(vsrc, mask=mask), mask=mask)
            tl.store(v_cache_ptr + cache + HALF, tl.load(vsrc + HALF, mask=mask), mask=mask)


def rope_kv_write(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor,
                  sin: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  slot_mapping: torch.Tensor, q_norm: torch.Tensor | None = None,
                  k_norm: torch.Tensor | None = None, eps: float = 1e-6):
    """q: [T, Hq, D], k/v: [T, Hkv, D] (strided views are fine, unit stride on D); cos/sin:
    [T, D/2] rows (strided); caches: [num_blocks, block_size, Hkv, D] contiguous; slot_mapping:
    [T] (-1: not stored). Returns contiguous rotated (q, k)."""
    tokens, num_q_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    half = head_dim // 2
    if half & (half - 1):
        raise ValueError(f"rope_kv_write needs a power-of-two head_dim/2, got {head_dim}")
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("paged caches must be contiguous")
    cos, sin = cos.reshape(tokens, half), sin.reshape(tokens, half)
    q_out = torch.empty((tokens, num_q_heads, head_dim), dtype=q.dtype, device=q.device)
    k_out = torch.empty((tokens, num_kv_heads, head_dim), dtype=k.dtype, device=k.device)
    has_norm = q_norm is not None
    if tokens:
        q_heads, kv_heads = triton.next_power_of_2(num_q_heads), triton.next_power_of_2(num_kv_heads)
        _rope_kv_kernel[(tokens, 2)](
            q, k, v, cos, sin, q_norm if has_norm else q, k_norm if has_norm else k,
            q_out, k_out, k_cache, v_cache, slot_mapping,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            cos.stride(0), sin.stride(0), num_q_heads, num_kv_heads, eps,
            Q_HEADS=q_heads, KV_HEADS=kv_heads, HALF=half, HAS_NORM=has_norm,
            num_warps=max(1, min(8, q_heads * half // 256)),
        )
    return q_out, k_out
