"""Torch references of every kernel. The elementwise ones are the model's own torch ops (the
model runs them through prelude.model.ops wherever Triton does not), so a kernel that matches
them changes no model output; the fused ones are compositions of those ops plus the torch
reference attention's KV write. Imports nothing from prelude: kernels sit below the model."""
from __future__ import annotations

import torch
import torch.nn.functional as F


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


def gelu_and_mul(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.chunk(2, dim=-1)
    return F.gelu(gate) * up

__all__ = ["gather_last", "gelu_and_mul", "rms_norm", "rope_kv_write", "rotate", "silu_and_mul"]


def rope_kv_write(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor,
                  sin: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  slot_mapping: torch.Tensor, q_norm: torch.Tensor | None = None,
                  k_norm: torch.Tensor | None = None, eps: float = 1e-6):
    """Optional per-head RMSNorm of q and k, neox RoPE, then k (rotated) and v stored into the
    paged cache at slot_mapping (-1: not stored). cos/sin: [T, D/2]. Returns rotated (q, k)."""
    if q_norm is not None:
        assert k_norm is not None, "q_norm and k_norm come together (the model's qk_norm)"
        q, k = rms_norm(q, q_norm, eps), rms_norm(k, k_norm, eps)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    q, k = rotate(q, cos, sin), rotate(k, cos, sin)
    stored = slot_mapping >= 0
    flat_k = k_cache.view(-1, *k_cache.shape[-2:])
    flat_v = v_cache.view(-1, *v_cache.shape[-2:])
    flat_k[slot_mapping[stored]] = k[stored]
    flat_v[slot_mapping[stored]] = v[stored]
    return q, k


def gather_last(hidden: torch.Tensor, query_starts: torch.Tensor) -> torch.Tensor:
    """Row i of the result is hidden[query_starts[i + 1] - 1]: each row's last position."""
    return hidden[query_starts[1:].long() - 1]
