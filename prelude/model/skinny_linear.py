"""Linear layers for a few rows on the CPU, at the speed of memory.

A decode step multiplies a few token rows by every weight of the model, so its cost should be
one pass over the weights whatever the row count. `F.linear` is not: MKL's matrix-vector path
for one row and its skinny GEMM for a few each took two to five times as long as reading the
weight (the Qwen3 LM head [151936, 512], one thread: 34 ms for one row, 60-80 ms for two to
eight, against 15-18 ms to read it), and in a decode step's profile the linear layers and the LM
head were two thirds of the time. kernels/cpu/skinny_gemm.hpp reads each weight row once and
dots it with every input row while it is in L1; `python -m bench.serving.lm_head` measures it.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

SkinnyMatmul = Callable[[int, int, int, int, int, int, int], None]
skinny_matmul: SkinnyMatmul | None
try:
    from kernels.cpu._native import skinny_matmul
except ImportError:  # the extension is not built (a source checkout before `pip install -e .`)
    skinny_matmul = None

# Past this many rows the product is compute-bound and MKL's blocking does as well.
MAX_SKINNY_ROWS = 32
# Weights smaller than this are not worth a second thread (thread start-up costs ~30 µs).
_THREADED_ELEMENTS = 1 << 20


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., in] times weight [out, in] transposed, plus bias: F.linear's contract."""
    width = x.shape[-1]
    rows = x.numel() // width if width else 0
    if (skinny_matmul is None or x.device.type != "cpu" or not 0 < rows <= MAX_SKINNY_ROWS
            or x.dtype != torch.float32 or weight.dtype != torch.float32
            or width % 8 or not weight.is_contiguous() or torch.is_grad_enabled()):
        return F.linear(x, weight, bias)
    flat = x.reshape(rows, width).contiguous()
    out_features = weight.shape[0]
    out = flat.new_empty(rows, out_features)
    threads = torch.get_num_threads() if weight.numel() >= _THREADED_ELEMENTS else 1
    skinny_matmul(flat.data_ptr(), rows, weight.data_ptr(), width, out.data_ptr(), out_features, threads)
    if bias is not None:
        out += bias
    return out.view(*x.shape[:-1], out_features)
