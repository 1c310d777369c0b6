"""The decoder's elementwise ops on the CPU in fp32 through the native kernels
(kernels/cpu/elementwise.hpp), with kernels/reference.py's signatures and results. Anything the
kernels do not take (another dtype or device, odd sizes, unusual strides) goes to the reference."""
from __future__ import annotations

import torch

from kernels import reference

try:
    from kernels.cpu import _native
except ImportError:  # the extension is not built (a source checkout before `pip install -e .`)
    _native = None  # type: ignore[assignment]

built = _native is not None
# Every decoder layer of a decode step in one call (prelude/model/fused_decode.py wraps it).
decode_step = _native.decode_step if _native is not None else None


def _native_fp32(x: torch.Tensor) -> bool:
    return _native is not None and x.dtype == torch.float32 and x.device.type == "cpu" and x.stride(-1) == 1


def _rows_heads(x: torch.Tensor) -> tuple[int, int, int, int] | None:
    """(rows, heads, row_stride, head_stride) of a 2-D [rows, dim] or 3-D [rows, heads, dim] x."""
    if x.dim() == 2:
        return x.shape[0], 1, x.stride(0), 0
    if x.dim() == 3:
        return x.shape[0], x.shape[1], x.stride(0), x.stride(1)
    return None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    dim = x.shape[-1]
    layout = _rows_heads(x)
    if (layout is None or not _native_fp32(x) or dim % 8 or weight.dtype != torch.float32
            or not weight.is_contiguous()
            or (residual is not None and (x.dim() != 2 or residual.shape != x.shape or not residual.is_contiguous()
                                          or residual.dtype != torch.float32))):
        return reference.rms_norm(x, weight, eps, residual)
    rows, heads, row_stride, head_stride = layout
    out = torch.empty(x.shape, dtype=x.dtype)
    summed = torch.empty_like(residual) if residual is not None else None
    _native.rms_norm(x.data_ptr(), rows, heads, dim, row_stride, head_stride, weight.data_ptr(), eps,
                     0 if residual is None else residual.data_ptr(), 0 if summed is None else summed.data_ptr(),
                     out.data_ptr(), torch.get_num_threads())
    return out if summed is None else (out, summed)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    dim = x.shape[-1]
    layout = _rows_heads(x)
    if (layout is None or x.dim() != 3 or not _native_fp32(x) or dim % 16 or cos.dtype != torch.float32
            or cos.shape[0] != x.shape[0] or cos.shape[-1] * 2 != dim or sin.shape != cos.shape
            or cos.stride(-1) != 1 or sin.stride(-1) != 1 or cos.stride(0) != sin.stride(0)
            or (cos.dim() == 3 and cos.shape[1] != 1)):
        return reference.rotate(x, cos, sin)
    rows, heads, row_stride, head_stride = layout
    out = torch.empty(x.shape, dtype=x.dtype)
    _native.rotate(x.data_ptr(), rows, heads, dim, row_stride, head_stride, cos.data_ptr(), sin.data_ptr(),
                   cos.stride(0), out.data_ptr(), torch.get_num_threads())
    return out


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    width = x.shape[-1] // 2
    if x.dim() != 2 or not _native_fp32(x) or width % 8 or not x.is_contiguous():
        return reference.silu_and_mul(x)
    out = torch.empty(x.shape[0], width, dtype=x.dtype)
    _native.silu_and_mul(x.data_ptr(), x.shape[0], width, out.data_ptr(), torch.get_num_threads())
    return out
