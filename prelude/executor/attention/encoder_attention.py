"""An encoder's attention over a flattened step: every row's queries attend to all of the row's
own tokens (or, with a window, to those at most `window` positions away), nothing is cached.

Short rows run as one padded batch under a key mask (one call instead of one per row); long
rows one at a time without a mask, on torch's flash kernel, where a mask would send the whole
batch down its quadratic math path."""
from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

# Rows up to this many tokens are batched (padded to the longest of them).
PADDED_ROW_TOKENS = 64


def bidirectional_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, query_starts: Sequence[int],
                            window: int = 0) -> torch.Tensor:
    """q, k, v: [tokens, heads, head_dim] (as many K/V heads as query heads); the result is q's shape."""
    out = torch.empty_like(q)
    short = []
    for row in range(len(query_starts) - 1):
        start, end = query_starts[row], query_starts[row + 1]
        if end - start <= PADDED_ROW_TOKENS:
            short.append((start, end))
        else:
            out[start:end] = _row(q[start:end], k[start:end], v[start:end], window)
    if len(short) == 1:
        start, end = short[0]
        out[start:end] = _row(q[start:end], k[start:end], v[start:end], window)
    elif short:
        _padded(q, k, v, short, window, out)
    return out


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
