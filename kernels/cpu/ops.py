"""The decoder's elementwise ops on the CPU in fp32 through the native kernels
(kernels/cpu/elementwise.hpp), with kernels/reference.py's signatures and results, and an
encoder's LayerNorm and GELU with torch's. Anything the kernels do not take (another dtype or
device, odd sizes, unusual strides) goes to the reference (or torch)."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, NamedTuple

import torch
import torch.nn.functional as F

from kernels import reference

try:
    from kernels.cpu import _native
except ImportError:  # the extension is not built (a source checkout before `pip install -e .`)
    _native = None  # type: ignore[assignment]

built = _native is not None
# Every decoder layer of a step in one call, or resumably in several (prelude/executor/fused_step.py
# wraps them).
forward_step = _native.forward_step if _native is not None else None
resumable_step = _native.ResumableStep if _native is not None else None


@contextmanager
def team_held() -> Iterator[None]:
    """Around a run of native calls with Python between them (an encoder's layers): the thread
    team's workers wait for the next call instead of sleeping after each (kernels/cpu/team.hpp)."""
    if _native is None:
        yield
        return
    _native.team_held(True)
    try:
        yield
    finally:
        _native.team_held(False)


# Chunks of more than 512 queries with heads of 128 over more than 1,024 keys stay on torch's
# flash kernel, which is faster there; shorter chunks, rows of up to 1,024 tokens and heads of 32
# and 64 are as fast or faster natively (`python -m bench.kernels.prefill_attention`).
WIDE_HEAD, WIDE_HEAD_MAX_KEYS, WIDE_HEAD_MAX_QUERIES = 128, 1024, 512


def prefill_wins(queries: int, keys: int, dim: int) -> bool:
    """Whether the native kernel attends these queries faster than torch's flash kernel."""
    return not (dim >= WIDE_HEAD and keys > WIDE_HEAD_MAX_KEYS and queries > WIDE_HEAD_MAX_QUERIES)


class CachedContext(NamedTuple):
    """A row's cached context where it lies: its first `length` tokens' K/V in the blocks of
    k_cache/v_cache ([blocks, block_size, kv_heads, dim], maybe a slice of the heads) that
    `blocks` (int64) lists in order."""

    k_cache: torch.Tensor
    v_cache: torch.Tensor
    blocks: torch.Tensor
    length: int

    @classmethod
    def whole(cls, k: torch.Tensor, v: torch.Tensor) -> CachedContext:
        """Keys and values already in one run ([length, kv_heads, dim]), as one block."""
        return cls(k.unsqueeze(0), v.unsqueeze(0), torch.zeros(1, dtype=torch.long, device=k.device), len(k))

    def gathered(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The context's keys and values copied out of its blocks, [length, kv_heads, dim]: for
        the attentions that take them whole."""
        return (self.k_cache[self.blocks].flatten(0, 1)[:self.length],
                self.v_cache[self.blocks].flatten(0, 1)[:self.length])


def causal_prefill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   context: CachedContext | None = None) -> torch.Tensor | None:
    """Causal attention of a row's last n new tokens (q: [n, heads, dim]) over its cached context
    (seen whole, read from its blocks) and its new keys and values (k, v: [fresh >= n, kv_heads,
    dim], the queries' own last): query i sees everything before the n queries and new keys up to
    its own (kernels/cpu/prefill_attention.hpp). fp32 on the CPU, each token's heads contiguous.
    None where the kernel does not apply; the caller's reference attention answers then."""
    n, heads, dim = q.shape
    fresh, kv_heads = k.shape[0], k.shape[1]
    past = 0 if context is None else context.length
    if (not all(_native_fp32(x) and x.stride(1) == dim for x in (q, k, v)) or dim % 8 or heads % kv_heads
            or v.shape != k.shape or fresh < n or n < 1 or not prefill_wins(n, past + fresh, dim)):
        return None
    k_cache = v_cache = blocks = k  # no context: the kernel reads none of them
    block_size = block_stride = token_stride = 1
    if context is not None and past:
        k_cache, v_cache, blocks = context.k_cache, context.v_cache, context.blocks
        block_size, block_stride, token_stride = k_cache.shape[1], k_cache.stride(0), k_cache.stride(1)
        if (not all(_native_fp32(x) and x.stride(2) == dim for x in (k_cache, v_cache))
                or v_cache.stride() != k_cache.stride() or k_cache.shape[2:] != k.shape[1:]
                or blocks.dtype != torch.long or not blocks.is_contiguous() or len(blocks) * block_size < past):
            return None
    out = torch.empty(n, heads, dim)
    _native.causal_prefill(q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), n, fresh, heads, kv_heads, dim,
                           q.stride(0), k.stride(0), v.stride(0), k_cache.data_ptr(), v_cache.data_ptr(),
                           blocks.data_ptr(), past, block_size, block_stride, token_stride, dim ** -0.5,
                           torch.get_num_threads())
    return out


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
    return _gated(x, "silu")


def gelu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """GeGLU (ModernBERT's MLP): the erf GELU of x's first half times its second half."""
    return _gated(x, "gelu")


def _gated(x: torch.Tensor, activation: str) -> torch.Tensor:
    width = x.shape[-1] // 2
    if x.dim() != 2 or not _native_fp32(x) or width % 8 or not x.is_contiguous():
        return reference.gelu_and_mul(x) if activation == "gelu" else reference.silu_and_mul(x)
    out = torch.empty(x.shape[0], width, dtype=x.dtype)
    native = _native.gelu_and_mul if activation == "gelu" else _native.silu_and_mul
    native(x.data_ptr(), x.shape[0], width, out.data_ptr(), torch.get_num_threads())
    return out


# GELU runs natively on one thread up to this many floats (team.hpp's kTeamMinFloats, where the
# team would start): on a short text's rows torch hands each op to its threads at 60-100 us a
# call. Larger ones stay on torch (BERT's GELU is its dense layer's epilogue instead).
ENCODER_NATIVE_FLOATS = 1 << 16


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, eps: float,
               residual: torch.Tensor | None = None) -> torch.Tensor:
    """F.layer_norm over the last dimension of x (+ residual, added first)."""
    dim = x.shape[-1]
    operands = [t for t in (x, weight, bias, residual) if t is not None]
    if (x.dim() != 2 or not _native_fp32(x) or dim % 8 or weight.shape != (dim,) or torch.is_grad_enabled()
            or (residual is not None and residual.shape != x.shape)
            or not all(t.dtype == torch.float32 and t.is_contiguous() for t in operands)):
        summed = x if residual is None else x + residual
        return F.layer_norm(summed, (dim,), weight, bias, eps)
    out = torch.empty(x.shape, dtype=x.dtype)
    _native.layer_norm(x.data_ptr(), 0 if residual is None else residual.data_ptr(), x.shape[0], dim,
                       weight.data_ptr(), 0 if bias is None else bias.data_ptr(), eps, out.data_ptr(),
                       torch.get_num_threads())
    return out


def gelu(x: torch.Tensor) -> torch.Tensor:
    """F.gelu (the erf form)."""
    if (not _native_fp32(x) or not x.is_contiguous() or x.numel() % 8 or x.numel() > ENCODER_NATIVE_FLOATS
            or torch.is_grad_enabled()):
        return F.gelu(x)
    out = torch.empty(x.shape, dtype=x.dtype)
    _native.gelu(x.data_ptr(), out.data_ptr(), x.numel())
    return out
