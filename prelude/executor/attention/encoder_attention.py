"""An encoder's attention over a flattened step: every row's queries attend to all of the row's
own tokens (or, with a window, to those at most `window` positions away), nothing is cached.

On the CPU in fp32, the rows go to the native kernels in one call
(kernels/cpu/encoder_attention.hpp: AMX's tiles where the CPU has them, else the vector prefill
kernel; every key seen), except a row whose window hides some of its keys: it reads q, k and v
where the fused projection left them and writes the output in place.
Elsewhere, short rows run as one padded batch under a key mask (one call instead of one per row),
long rows one at a time without a mask on torch's flash kernel, where a mask would send the whole
batch down its quadratic math path."""
from __future__ import annotations

import math
from array import array
from typing import Callable, Sequence

import torch
import torch.nn.functional as F

bidirectional_rows: Callable[..., None] | None
try:
    from kernels.cpu._native import bidirectional_rows
except ImportError:  # the extension is not built (a source checkout before `pip install -e .`)
    bidirectional_rows = None

# Rows up to this many tokens are batched (padded to the longest of them).
PADDED_ROW_TOKENS = 64


def bidirectional_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, query_starts: Sequence[int],
                            window: int = 0) -> torch.Tensor:
    """q, k, v: [tokens, heads, head_dim] (as many K/V heads as query heads); the result is q's shape."""
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    native = _native_takes(q, k, v)
    spans: list[int] = []  # (start, end) of each row for the native kernel
    short = []
    for row in range(len(query_starts) - 1):
        start, end = query_starts[row], query_starts[row + 1]
        if native and (not window or end - start <= window + 1):  # the window spans the whole row
            spans += (start, end)
        elif end - start <= PADDED_ROW_TOKENS:
            short.append((start, end))
        else:
            out[start:end] = _row(q[start:end], k[start:end], v[start:end], window)
    if len(short) == 1:
        start, end = short[0]
        out[start:end] = _row(q[start:end], k[start:end], v[start:end], window)
    elif short:
        _padded(q, k, v, short, window, out)
    if spans:
        _native_rows(q, k, v, spans, out)
    return out


def _native_takes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    return (bidirectional_rows is not None and q.device.type == "cpu" and q.shape[-1] % 8 == 0
            and all(t.dtype == torch.float32 and t.stride(2) == 1 and t.stride(1) == t.shape[2] for t in (q, k, v)))


def _native_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spans: list[int], out: torch.Tensor) -> None:
    """The rows [spans[2r], spans[2r + 1]) in one native call (one team dispatch for the step)."""
    assert bidirectional_rows is not None
    bounds = array("q", spans)
    dim = q.shape[2]
    bidirectional_rows(q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), bounds.buffer_info()[0],
                       len(spans) // 2, q.shape[1], dim, q.stride(0), k.stride(0), v.stride(0), 1.0 / math.sqrt(dim),
                       torch.get_num_threads())


def _row(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int) -> torch.Tensor:
    n = len(q)
    mask = _band(torch.arange(n, device=q.device), window) if window and n > window + 1 else None
    # [1, heads, n, head_dim]: torch's CPU flash kernel takes only batched (4-d) inputs.
    o = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                                       attn_mask=mask)
    return o[0].transpose(0, 1)


def _padded(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rows: list[tuple[int, int]], window: int,
            out: torch.Tensor) -> None:
    """The short rows as one [rows, heads, longest, head_dim] attention, padding keys masked out."""
    device = q.device
    lengths = torch.tensor([end - start for start, end in rows], device=device)
    longest = int(lengths.max())
    offsets = torch.arange(longest, device=device)
    valid = offsets[None, :] < lengths[:, None]  # [rows, longest]
    starts = torch.tensor([start for start, _ in rows], device=device)
    index = torch.where(valid, starts[:, None] + offsets[None, :], starts[:, None])  # padding reads a real token
    mask = valid[:, None, None, :]
    if window and longest > window + 1:
        mask = mask & _band(offsets, window)[None, None]
    o = F.scaled_dot_product_attention(q[index].transpose(1, 2), k[index].transpose(1, 2), v[index].transpose(1, 2),
                                       attn_mask=mask)
    out[index[valid]] = o.transpose(1, 2)[valid]


def _band(offsets: torch.Tensor, window: int) -> torch.Tensor:
    """[n, n]: which keys each query sees under a local window (at most `window` positions away)."""
    return (offsets[None, :] - offsets[:, None]).abs() <= window
