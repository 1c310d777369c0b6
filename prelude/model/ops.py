"""The elementwise and normalization ops of the decoder, behind one indirection so that the CUDA
executor can swap in Triton kernels at model build time while every other path keeps running
this plain torch code unchanged.

`TORCH_OPS` is the reference: its functions are exactly what the layers computed before the
indirection existed, and kernels/reference.py tests every Triton kernel against them.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

logger = logging.getLogger(__name__)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    """Normalizes x (after adding residual, when given). With a residual it returns
    (normed, x + residual) so the next block can reuse the sum."""
    if residual is not None:
        x = x + residual
        residual = x
    # Computed in fp32 and cast back, as the HF reference does.
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    out = weight * xf.to(x.dtype)
    return out if residual is None else (out, residual)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Neox-style rotary embedding (rotate halves); cos/sin broadcast over the head dim."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


@dataclass(frozen=True, slots=True)
class Ops:
    name: str
    rms_norm: Callable[..., object]
    rotate: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
    silu_and_mul: Callable[[torch.Tensor], torch.Tensor]


TORCH_OPS = Ops("torch", rms_norm, rotate, silu_and_mul)


def triton_ops() -> Ops:
    """Triton RMSNorm and SiLU-and-mul; rotation stays torch here because the CUDA attention
    backend fuses it with the KV write (kernels.rope) and this one only serves other paths."""
    from kernels.activation import silu_and_mul as triton_silu_and_mul
    from kernels.norm import rms_norm as triton_rms_norm

    return Ops("triton", triton_rms_norm, rotate, triton_silu_and_mul)


def select_ops(device: torch.device, kernels: str = "auto") -> Ops:
    """`auto`: Triton on CUDA when importable, torch everywhere else; `torch` forces torch."""
    if kernels == "torch" or device.type != "cuda":
        return TORCH_OPS
    from kernels import available

    if not available(device.type):
        logger.info("triton is not importable: the model runs its torch ops on %s", device)
        return TORCH_OPS
    return triton_ops()
