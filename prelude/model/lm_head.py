"""The LM head on the CPU at the speed of memory.

A decode step multiplies a few hidden rows by the whole [vocab, hidden] head, hundreds of MB in
fp32, so its cost should be one pass over the weight whatever the row count. `hidden @ W.t()`
is not: MKL's matrix-vector path for one row and its skinny GEMM for a few each took two to five
times as long as reading the weight (the Qwen3 head [151936, 512], one thread: 34 ms for one
row, 60-80 ms for two to eight, against 15-18 ms to read it). kernels/cpu/skinny_gemm.hpp reads
each weight row once and dots it with every hidden row while it is in L1;
`python -m bench.serving.lm_head` measures both.
"""
from __future__ import annotations

from typing import Callable

import torch

SkinnyMatmul = Callable[[int, int, int, int, int, int, int], None]
skinny_matmul: SkinnyMatmul | None
try:
    from kernels.cpu._gemm import skinny_matmul
except ImportError:  # the extension is not built (a source checkout before `pip install -e .`)
    skinny_matmul = None

# Past this many rows the product is compute-bound and MKL's blocking does as well.
MAX_SKINNY_ROWS = 32


def lm_head_logits(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """hidden [n, H] times weight [V, H] transposed: logits [n, V], contiguous."""
    n, width = hidden.shape
    if (skinny_matmul is None or hidden.device.type != "cpu" or not 0 < n <= MAX_SKINNY_ROWS
            or hidden.dtype != torch.float32 or weight.dtype != torch.float32
            or width % 8 or not weight.is_contiguous()):
        return hidden @ weight.t()
    hidden = hidden.contiguous()
    vocab = weight.shape[0]
    out = hidden.new_empty(n, vocab)
    # Small heads (the tests' tiny models) are not worth a thread.
    threads = torch.get_num_threads() if vocab * width >= 1 << 20 else 1
    skinny_matmul(hidden.data_ptr(), n, weight.data_ptr(), width, out.data_ptr(), vocab, threads)
    return out
