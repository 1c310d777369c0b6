"""Last-position gather: one row per sequence, straight from the device-side query offsets, so
the LM head of a OneShot step sees only rows that produce a token and the host never builds an
index tensor for it."""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _gather_last_kernel(h_ptr, starts_ptr, out_ptr, h_stride, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    src = tl.load(starts_ptr + row + 1).to(tl.int64) - 1
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    tl.store(out_ptr + row * n_cols + cols, tl.load(h_ptr + src * h_stride + cols, mask=mask), mask=mask)


def gather_last(hidden: torch.Tensor, query_starts: torch.Tensor) -> torch.Tensor:
    """hidden: [T, H]; query_starts: [R + 1] cumulative offsets on hidden's device -> [R, H]."""
    rows, n_cols = query_starts.shape[0] - 1, hidden.shape[1]
    out = torch.empty((rows, n_cols), dtype=hidden.dtype, device=hidden.device)
    block = min(triton.next_power_of_2(n_cols), 1024)
    if rows > 0:
        _gather_last_kernel[(rows, triton.cdiv(n_cols, block))](
            hidden, query_starts, out, hidden.stride(0), n_cols, BLOCK=block, num_warps=4)
    return out
