"""The native CPU norms, rotation, SwiGLU and GeGLU equal kernels/reference.py on the layouts the
model hands them (hidden rows with a residual, q/k heads strided inside the fused qkv output) and
fall back to the reference for anything else; an encoder's LayerNorm and GELU equal torch's."""
from __future__ import annotations

import pytest
import torch

from kernels import reference
from kernels.cpu import ops

pytestmark = pytest.mark.skipif(not ops.built, reason="kernels.cpu is not built")
GEN = torch.Generator().manual_seed(0)


def _randn(*shape, dtype=torch.float32):
    return torch.randn(*shape, generator=GEN).to(dtype)


@pytest.mark.parametrize("rows", [1, 3, 64])
@pytest.mark.parametrize("dim", [8, 256, 520])
def test_rms_norm_with_and_without_residual(rows, dim):
    x, residual, weight = _randn(rows, dim), _randn(rows, dim), _randn(dim)
    torch.testing.assert_close(ops.rms_norm(x, weight, 1e-6), reference.rms_norm(x, weight, 1e-6))
    out, summed = ops.rms_norm(x, weight, 1e-5, residual)
    ref_out, ref_summed = reference.rms_norm(x, weight, 1e-5, residual)
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(summed, ref_summed)


@pytest.mark.parametrize("rows", [1, 20, 170])  # 170 x 384 is split across the native team
@pytest.mark.parametrize("bias", [True, False])
@torch.inference_mode()
def test_encoder_layer_norm_after_its_residual_add(rows, bias):
    x, residual, weight = _randn(rows, 384), _randn(rows, 384), _randn(384)
    b = _randn(384) if bias else None
    torch.testing.assert_close(ops.layer_norm(x, weight, b, 1e-12, residual),
                               torch.nn.functional.layer_norm(x + residual, (384,), weight, b, 1e-12))
    torch.testing.assert_close(ops.layer_norm(x, weight, b, 1e-5), torch.nn.functional.layer_norm(x, (384,), weight, b))


@pytest.mark.parametrize("rows", [1, 20, 60])
@torch.inference_mode()  # the server's mode: with autograd on, gelu leaves it to torch
def test_encoder_gelu_is_torchs_erf_gelu(rows):
    x = _randn(rows, 1536) * 4  # past erf's saturation on both sides
    torch.testing.assert_close(ops.gelu(x), torch.nn.functional.gelu(x), rtol=1e-5, atol=3e-6)


def _qkv_views(tokens, heads, kv_heads, dim):
    qkv = _randn(tokens, (heads + 2 * kv_heads) * dim)
    q, k, _ = qkv.split([heads * dim, kv_heads * dim, kv_heads * dim], dim=-1)
    return q.view(tokens, heads, dim), k.view(tokens, kv_heads, dim)


@pytest.mark.parametrize("tokens,heads,kv_heads,dim", [(1, 8, 4, 32), (5, 16, 8, 64), (7, 4, 1, 128)])
def test_per_head_norm_and_rotation_of_strided_q_and_k(tokens, heads, kv_heads, dim):
    q, k = _qkv_views(tokens, heads, kv_heads, dim)
    assert tokens == 1 or not q.is_contiguous()
    weight = _randn(dim)
    table = _randn(100, dim)
    cos, sin = table[torch.randint(0, 100, (tokens,), generator=GEN)].unsqueeze(1).chunk(2, dim=-1)
    for x in (q, k):
        torch.testing.assert_close(ops.rms_norm(x, weight, 1e-6), reference.rms_norm(x, weight, 1e-6))
        torch.testing.assert_close(ops.rotate(x, cos, sin), reference.rotate(x, cos, sin))


@pytest.mark.parametrize("rows,width", [(1, 8), (4, 768), (33, 1536)])
def test_silu_and_mul(rows, width):
    x = _randn(rows, 2 * width) * 10  # large gates too: silu's tails
    torch.testing.assert_close(ops.silu_and_mul(x), reference.silu_and_mul(x))


@pytest.mark.parametrize("rows,width", [(1, 8), (4, 1152), (40, 1152)])  # 40 x 1152: split across the team
@torch.inference_mode()
def test_gelu_and_mul_is_modernberts_geglu(rows, width):
    x = _randn(rows, 2 * width) * 4  # past erf's saturation on both sides
    torch.testing.assert_close(ops.gelu_and_mul(x), reference.gelu_and_mul(x), rtol=1e-5, atol=3e-6)


def test_inputs_the_kernels_do_not_take_go_to_the_reference():
    weight = _randn(12)
    for x in (_randn(3, 12), _randn(3, 16, dtype=torch.bfloat16), _randn(2, 3, 4, 8)):
        w = weight if x.shape[-1] == 12 else _randn(x.shape[-1], dtype=x.dtype)
        torch.testing.assert_close(ops.rms_norm(x, w, 1e-6), reference.rms_norm(x, w, 1e-6))
    x = _randn(3, 2, 24)  # half of 24 is not a multiple of 8
    cos, sin = _randn(3, 1, 12), _randn(3, 1, 12)
    torch.testing.assert_close(ops.rotate(x, cos, sin), reference.rotate(x, cos, sin))
    x = _randn(3, 20)
    torch.testing.assert_close(ops.silu_and_mul(x), reference.silu_and_mul(x))
    torch.testing.assert_close(ops.gelu_and_mul(x), reference.gelu_and_mul(x))


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_prompt_sized_inputs_split_across_threads_equal_the_reference(threads):
    """A prompt's many rows run on the thread team (without the GIL); uneven splits included."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        x, residual, weight = _randn(301, 256), _randn(301, 256), _randn(256)
        out, summed = ops.rms_norm(x, weight, 1e-5, residual)
        ref_out, ref_summed = reference.rms_norm(x, weight, 1e-5, residual)
        torch.testing.assert_close(out, ref_out)
        torch.testing.assert_close(summed, ref_summed)
        q, k = _qkv_views(301, 16, 8, 64)
        table = _randn(400, 64)
        cos, sin = table[torch.randint(0, 400, (301,), generator=GEN)].unsqueeze(1).chunk(2, dim=-1)
        for h in (q, k):
            torch.testing.assert_close(ops.rms_norm(h, weight[:64], 1e-6), reference.rms_norm(h, weight[:64], 1e-6))
            torch.testing.assert_close(ops.rotate(h, cos, sin), reference.rotate(h, cos, sin))
        gates = _randn(301, 2 * 1536) * 10
        torch.testing.assert_close(ops.silu_and_mul(gates), reference.silu_and_mul(gates))
    finally:
        torch.set_num_threads(previous)
