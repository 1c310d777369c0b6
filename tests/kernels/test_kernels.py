"""Each Triton kernel against its torch reference (kernels.reference), on fresh random inputs
with outputs poisoned first, so unwritten elements show. fp32 must match to rounding; bf16 to
a couple of ulps (the CPU interpreter truncates fp32->bf16 where the GPU rounds to nearest)."""
from __future__ import annotations

import pytest
import torch

from kernels import reference

DTYPES = [torch.float32, torch.bfloat16]


def _tol(dtype: torch.dtype) -> dict:
    return dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,cols", [(1, 64), (7, 96), (33, 256)])
def test_rms_norm_with_and_without_residual(device, dtype, rows, cols):
    from kernels.norm import rms_norm

    g = _gen(rows * cols)
    x = torch.randn(rows, cols, generator=g).to(device, dtype)
    residual = torch.randn(rows, cols, generator=g).to(device, dtype)
    weight = (1 + 0.1 * torch.randn(cols, generator=g)).to(device, dtype)
    torch.testing.assert_close(rms_norm(x, weight, 1e-6), reference.rms_norm(x, weight, 1e-6), **_tol(dtype))
    out, res = rms_norm(x, weight, 1e-6, residual)
    ref_out, ref_res = reference.rms_norm(x, weight, 1e-6, residual)
    torch.testing.assert_close(res, ref_res, **_tol(dtype))
    torch.testing.assert_close(out, ref_out, **_tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_on_strided_per_head_view(device, dtype):
    """The q/k norms of Qwen3 run on [T, H, D] views into the fused qkv projection."""
    from kernels.norm import rms_norm

    g = _gen(5)
    qkv = torch.randn(6, 3 * 4 * 32, generator=g).to(device, dtype)
    q = qkv[:, : 4 * 32].view(6, 4, 32)
    weight = (1 + 0.1 * torch.randn(32, generator=g)).to(device, dtype)
    torch.testing.assert_close(rms_norm(q, weight, 1e-6), reference.rms_norm(q, weight, 1e-6), **_tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,inter", [(1, 64), (5, 300), (17, 1536)])
def test_silu_and_mul(device, dtype, rows, inter):
    from kernels.activation import silu_and_mul

    x = (3 * torch.randn(rows, 2 * inter, generator=_gen(inter))).to(device, dtype)
    torch.testing.assert_close(silu_and_mul(x), reference.silu_and_mul(x), **_tol(dtype))


def test_gather_last_rows(device):
    from kernels.gather import gather_last

    hidden = torch.randn(20, 48, generator=_gen(1)).to(device)
    starts = torch.tensor([0, 3, 4, 11, 20], dtype=torch.int32, device=device)
    out = gather_last(hidden, starts)
    assert out.shape == (4, 48)
    torch.testing.assert_close(out, reference.gather_last(hidden, starts), atol=0, rtol=0)
    assert gather_last(hidden, starts[:1]).shape == (0, 48)


def _rope_inputs(device, dtype, tokens=9, q_heads=4, kv_heads=2, head_dim=32, blocks=8, bs=4):
    g = _gen(tokens * head_dim)
    qkv = torch.randn(tokens, (q_heads + 2 * kv_heads) * head_dim, generator=g).to(device, dtype)
    q, k, v = qkv.split([q_heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    q = q.view(tokens, q_heads, head_dim)
    k = k.view(tokens, kv_heads, head_dim)
    v = v.view(tokens, kv_heads, head_dim)
    angles = torch.rand(tokens, head_dim // 2, generator=g) * 6.3
    # [T, 1, D] in the activation dtype, chunked like RotaryEmbedding.lookup returns it.
    table = torch.cat([angles.cos(), angles.sin()], dim=-1).to(device, dtype).unsqueeze(1)
    cos, sin = table.chunk(2, dim=-1)
    cache_shape = (blocks, bs, kv_heads, head_dim)
    return q, k, v, cos, sin, cache_shape


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_norm", [False, True])
@pytest.mark.parametrize("heads", [(4, 2), (5, 3)])  # head counts that are not powers of two are masked
def test_rope_kv_write_matches_reference(device, dtype, with_norm, heads):
    from kernels.rope import rope_kv_write

    q, k, v, cos, sin, cache_shape = _rope_inputs(device, dtype, q_heads=heads[0], kv_heads=heads[1])
    slots = torch.tensor([5, 6, 7, -1, 12, 13, -1, 30, 0], device=device)
    norms = {}
    if with_norm:
        g = _gen(11)
        norms = dict(q_norm=(1 + 0.1 * torch.randn(32, generator=g)).to(device, dtype),
                     k_norm=(1 + 0.1 * torch.randn(32, generator=g)).to(device, dtype))
    poison = float("nan") if dtype == torch.float32 else 1e4
    k_cache = torch.full(cache_shape, poison, dtype=dtype, device=device)
    v_cache = torch.full(cache_shape, poison, dtype=dtype, device=device)
    ref_k_cache, ref_v_cache = k_cache.clone(), v_cache.clone()
    q_out, k_out = rope_kv_write(q, k, v, cos, sin, k_cache, v_cache, slots, eps=1e-6, **norms)
    ref_q, ref_k = reference.rope_kv_write(q, k, v, cos.squeeze(1), sin.squeeze(1), ref_k_cache,
                                           ref_v_cache, slots, eps=1e-6, **norms)
    assert q_out.is_contiguous() and k_out.is_contiguous()
    torch.testing.assert_close(q_out, ref_q, **_tol(dtype))
    torch.testing.assert_close(k_out, ref_k, **_tol(dtype))
    # Unstored slots keep their poison; stored ones hold the rotated k and the raw v.
    torch.testing.assert_close(k_cache, ref_k_cache, equal_nan=True, **_tol(dtype))
    torch.testing.assert_close(v_cache, ref_v_cache, equal_nan=True, atol=0, rtol=0)
