"""Linear layers on the CPU in fp32 on the native kernels (kernels/cpu/linear.hpp): a few rows at
the speed of memory, many at the speed of the cores.

A decode step multiplies a few token rows by every weight of the model, so its cost should be
one pass over the weights whatever the row count. `F.linear` is not: MKL's matrix-vector path
for one row and its skinny GEMM for a few each take several times as long as reading the
weight, and the linear layers and the LM head are most of a decode step.
kernels/cpu/skinny_gemm.hpp reads each weight row once and dots it with every input row while it
is in L1; `python -m bench.kernels.lm_head` measures it.

Prompts (more rows) are compute-bound. kernels/cpu/packed_gemm.hpp runs on a copy of the weight
packed once into panels, faster than MKL's sgemm (which `F.linear` calls) and as fast as oneDNN
on its own reordered copy, and it runs inside the native step (kernels/cpu/step_layers.hpp)
without the GIL. A module keeps that copy in a
`PackedWeight`, made at warm-up: the weights of the decoder layers are then held twice.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

try:
    from kernels.cpu import _native
except ImportError:  # the extension is not built (a source checkout before `pip install -e .`)
    _native = None  # type: ignore[assignment]

built = _native is not None
# Without a packed copy (the LM head), past this many rows the product goes to torch.
MAX_SKINNY_ROWS = 32


class PackedWeight:
    """A module's weight packed for kernels/cpu/packed_gemm.hpp, made on first use (weights never
    change after loading); None where the native kernels do not take it."""

    def __init__(self) -> None:
        self.packed: torch.Tensor | None = None

    def get(self, weight: torch.Tensor) -> torch.Tensor | None:
        if self.packed is None and _fits(weight):
            assert _native is not None
            outputs, inputs = weight.shape
            self.packed = torch.empty(_native.packed_size(outputs, inputs))
            _native.pack_linear(weight.data_ptr(), outputs, inputs, self.packed.data_ptr())
        return self.packed

    def prepare(self, weight: torch.Tensor) -> None:
        """Makes the copy now (the server's warm-up) rather than on the first prompt."""
        self.get(weight)


def _fits(weight: torch.Tensor) -> bool:
    return (_native is not None and weight.device.type == "cpu" and weight.dtype == torch.float32
            and weight.dim() == 2 and weight.is_contiguous() and weight.shape[1] % 8 == 0)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           packed: PackedWeight | None = None) -> torch.Tensor:
    """x [..., in] times weight [out, in] transposed, plus bias: F.linear's contract. `packed`:
    the module's packed copy of the weight, for products of many rows."""
    width = x.shape[-1]
    rows = x.numel() // width if width else 0
    if (x.dtype != torch.float32 or torch.is_grad_enabled() or rows == 0 or not _fits(weight)
            or x.device.type != "cpu"):
        return F.linear(x, weight, bias)
    copy = packed.get(weight) if packed is not None else None
    if copy is None and rows > MAX_SKINNY_ROWS:
        return F.linear(x, weight, bias)
    assert _native is not None
    flat = x.reshape(rows, width).contiguous()
    out_features = weight.shape[0]
    out = flat.new_empty(rows, out_features)
    # The kernels keep a small weight on one thread (kernels/cpu/team.hpp, threads_worth).
    _native.matmul(flat.data_ptr(), rows, weight.data_ptr(), 0 if copy is None else copy.data_ptr(), width,
                   out.data_ptr(), out_features, torch.get_num_threads())
    if bias is not None:
        out += bias
    return out.view(*x.shape[:-1], out_features)
