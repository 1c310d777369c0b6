"""Linear layers on the CPU in fp32: a few rows at the speed of memory, many through oneDNN.

A decode step multiplies a few token rows by every weight of the model, so its cost should be
one pass over the weights whatever the row count. `F.linear` is not: MKL's matrix-vector path
for one row and its skinny GEMM for a few each took two to five times as long as reading the
weight (the Qwen3 LM head [151936, 512], one thread: 34 ms for one row, 60-80 ms for two to
eight, against 15-18 ms to read it), and in a decode step's profile the linear layers and the LM
head were two thirds of the time. kernels/cpu/skinny_gemm.hpp reads each weight row once and
dots it with every input row while it is in L1; `python -m bench.serving.lm_head` measures it.

Prompts (more rows) are compute-bound, and there MKL's sgemm, which `F.linear` calls, ran at
90-145 GFLOPS on the 2-core AMD dev machine against 170-210 for oneDNN on a weight reordered
once into its blocked layout (1.2-1.9x, most at 33-512 rows). A module keeps that copy in a
`PackedWeight`, made on its first prompt: the weights of the decoder layers are then held twice.
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

# Past this many rows the product is compute-bound and a blocked GEMM does better.
MAX_SKINNY_ROWS = 32


_ONEDNN = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


class PackedWeight:
    """A module's weight in oneDNN's blocked layout, made on first use (weights never change
    after loading)."""

    def __init__(self) -> None:
        self.packed: torch.Tensor | None = None

    def get(self, weight: torch.Tensor, rows: int) -> torch.Tensor:
        if self.packed is None:
            self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, rows)
        return self.packed

    def prepare(self, weight: torch.Tensor) -> None:
        """Makes the copy now (the server's warm-up) if prompts will use it."""
        if _ONEDNN and weight.device.type == "cpu" and weight.dtype == torch.float32:
            self.get(weight, 256)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           packed: PackedWeight | None = None) -> torch.Tensor:
    """x [..., in] times weight [out, in] transposed, plus bias: F.linear's contract. `packed`:
    the module's oneDNN copy of the weight, for products of many rows."""
    width = x.shape[-1]
    rows = x.numel() // width if width else 0
    if (x.device.type != "cpu" or x.dtype != torch.float32 or weight.dtype != torch.float32
            or torch.is_grad_enabled() or rows == 0):
        return F.linear(x, weight, bias)
    if rows > MAX_SKINNY_ROWS or skinny_matmul is None or width % 8 or not weight.is_contiguous():
        if packed is None or not _ONEDNN:
            return F.linear(x, weight, bias)
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), packed.get(weight, rows), bias, "none", [], "")
    flat = x.reshape(rows, width).contiguous()
    out_features = weight.shape[0]
    out = flat.new_empty(rows, out_features)
    # The kernel keeps a small weight on one thread (kernels/cpu/team.hpp, threads_worth).
    skinny_matmul(flat.data_ptr(), rows, weight.data_ptr(), width, out.data_ptr(), out_features,
                  torch.get_num_threads())
    if bias is not None:
        out += bias
    return out.view(*x.shape[:-1], out_features)
