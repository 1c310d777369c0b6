"""Fused RMSNorm (optionally adding the residual first), one program per row.

Rounds to the activation dtype exactly where prelude.model.layers.RMSNorm does (after the
residual add, before the weight multiply), so bf16 outputs match the torch path bit for bit
up to the order of the fp32 sum.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rms_norm_kernel(
    x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr,
    inner, x_stride_outer, x_stride_inner, res_stride, n_cols, eps,
    HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr,
):
    # Rows of a strided [outer, inner, n_cols] view (inner = 1 for a plain 2-D tensor): the
    # per-head q/k norms run on views of the fused qkv output without copying them first.
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x_off = (row // inner) * x_stride_outer + (row % inner) * x_stride_inner
    x = tl.load(x_ptr + x_off + cols, mask=mask, other=0.0)
    dtype = x.dtype
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * res_stride + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(dtype)
        tl.store(res_out_ptr + row * n_cols + cols, x, mask=mask)
    xf = x.to(tl.float32)
    mean_sq = tl.sum(xf * xf, axis=0) / n_cols
    normed = (xf * tl.rsqrt(mean_sq + eps)).to(dtype)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    out = (w.to(tl.float32) * normed.to(tl.float32)).to(dtype)
    tl.store(out_ptr + row * n_cols + cols, out, mask=mask)


def _row_layout(x: torch.Tensor) -> tuple[int, int, int, int]:
    """(rows, inner, stride_outer, stride_inner) addressing the rows of x's leading dims (x has
    at most 3 dims: rms_norm flattens more before it gets here)."""
    if x.stride(-1) != 1:
        raise ValueError("rms_norm needs a unit stride on the normalized dimension")
    if x.dim() == 1:
        return 1, 1, 0, 0
    if x.dim() == 2:
        return x.shape[0], 1, x.stride(0), 0
    return x.shape[0] * x.shape[1], x.shape[1], x.stride(0), x.stride(1)


def _launch_config(n_cols: int) -> tuple[int, int]:
    block = triton.next_power_of_2(n_cols)
    return block, min(max(block // 256, 1), 8)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None):
    """RMSNorm over the last dim of x ([T, N] or a strided [T, H, D] view). With a residual
    ([T, N], contiguous) returns (normed, x + residual) like layers.RMSNorm."""
    n_cols = x.shape[-1]
    if x.dim() > 3:
        x = x.reshape(-1, n_cols)
    rows, inner, stride_outer, stride_inner = _row_layout(x)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    res_out = torch.empty_like(out) if residual is not None else out
    if residual is not None and residual.stride(-1) != 1:
        residual = residual.contiguous()
    block, warps = _launch_config(n_cols)
    if rows:
        _rms_norm_kernel[(rows,)](
            x, residual if residual is not None else x, weight, out, res_out,
            inner, stride_outer, stride_inner,
            residual.stride(0) if residual is not None else 0, n_cols, eps,
            HAS_RESIDUAL=residual is not None, BLOCK=block, num_warps=warps,
        )
    return out if residual is None else (out, res_out)
