"""Linear layers on the CPU on the native kernels (kernels/cpu/linear.hpp), with fp32 activations
and weights stored in fp32, bf16 or int8 (a packed narrow weight multiplies rows rounded to its
format where the CPU has the instructions: AVX-512 BF16, VNNI): a few rows at the speed of
memory, many at the speed of the cores.

A decode step multiplies a few token rows by every weight of the model, so its cost should be
one pass over the weights whatever the row count. `F.linear` is not: MKL's matrix-vector path
for one row and its skinny GEMM for a few each take several times as long as reading the
weight, and the linear layers and the LM head are most of a decode step. Prompts (more rows)
are compute-bound, and MKL's sgemm falls behind a kernel on a weight packed once into panels.

So a decoder layer's weight is kept once, packed into panels (kernels/cpu/packed_gemm.hpp: few
rows stream the panels, more run register tiles, both without the GIL inside the native step),
and its checkpoint copy is dropped. An LM head tied to its embedding stays by rows, which its
lookups read (kernels/cpu/skinny_gemm.hpp; many rows of a bf16 one on AMX's tiles,
kernels/cpu/head_tiles.hpp), except where panels serve it better (HEAD_LAYOUTS): lookups then
gather from the panels. bf16 halves and int8 quarters the bytes a decode
step reads (kernels/cpu/weights.hpp: int8 with one scale per output); `python -m
bench.kernels.lm_head` measures the formats.

An fp32 weight on a CPU with AMX (a decoder's layers, an encoder's dense layers) is kept as
"bf16x3": the bf16 panels of its rounding and of the rest, which the tiles multiply by the rows
split alike, three bf16 products per product (kernels/cpu/amx_gemm.hpp), within 2^-16 of fp32's
and 2-4x as fast on a prompt's rows, in fp32's bytes; a decode step's few rows stream both
halves in fp32 instead (kernels/cpu/linear.hpp), as fast as fp32's panels.

A weight in panels that bf16 holds exactly (a bf16 checkpoint's, which the CPU serves in fp32 by
default) loses nothing in bf16: "bf16x2" keeps its one bf16 packing, half fp32's bytes, on any
CPU. On AMX the tiles multiply it by both halves of the rows (two products: bf16x3's sums, its
rest being zero); elsewhere the panels are widened into fp32 products as read, fp32's own
arithmetic. Its head and embedding by rows are kept in bf16 where the CPU has AMX, whose tiles
take a head's many rows (layers._stored chooses). A decode step reads half the bytes.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from prelude.model.weight_formats import (BY_ROWS, CODES, GROUPS, HEAD_LAYOUTS, PANELS, SPLIT_K, SPLIT_PRODUCTS,
                                          storable_shape)

try:
    from kernels.cpu import _native
except ImportError:  # the extension is not built (a source checkout before `pip install -e .`)
    _native = None  # type: ignore[assignment]

__all__ = ["BY_ROWS", "HEAD_LAYOUTS", "PANELS", "SPLIT_K", "SPLIT_PRODUCTS", "FORMATS", "SOURCES", "StoredWeight",
           "bf16_exact", "dequantized", "linear", "readable", "storable", "store"]

built = _native is not None
# A weight by rows in fp32 (an LM head): past this many rows the product goes to torch's GEMM,
# which is faster there (`python -m bench.kernels.lm_head`): 64 where the by-rows kernel runs
# sixteen lanes (AVX-512; 0.84-0.93x MKL's time from 32 to 64 rows, 1.03-1.08x beyond), 32 on eight.
MAX_SKINNY_ROWS = 64 if _native is not None and _native.wide_vectors() else 32

# Weight formats: name -> (the kernels' code, the storage dtype, elements per interleaved group,
# which a by-rows weight's rows must hold whole); model.weight_formats decides which a weight gets.
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "int8": torch.int8, "bf16x3": torch.bfloat16,
           "bf16x2": torch.bfloat16}  # bf16x3: two bf16 packings; bf16x2: bf16x3 of a weight bf16 holds exactly
FORMATS = {name: (CODES[name], _DTYPES[name], GROUPS[name]) for name in CODES}
# The dtypes a weight is stored from (the kernels' source code): fp32, and a bf16 checkpoint's own
# tensors, which the loader reads as they are (model.loader) rather than widened to fp32 first.
SOURCES = {torch.float32: 0, torch.bfloat16: 1}
EXACT_BLOCK = 2048  # rows bf16_exact looks at a time
# What the kernels can apply to a product before they store it (kernels/cpu/packed_gemm.hpp's
# Activation): an encoder's dense layers.
EPILOGUE_ACTIVATIONS = {None: 0, "gelu": 1}


@dataclass(frozen=True, slots=True)
class StoredWeight:
    """An [outputs, inputs] weight as the native kernels read it (kernels/cpu/weights.hpp)."""

    data: torch.Tensor  # packed panels, or rows with each group interleaved (weights.hpp)
    scales: torch.Tensor | None  # int8: one per output
    format: str
    layout: int  # BY_ROWS or PANELS
    outputs: int
    inputs: int

    @property
    def nbytes(self) -> int:
        return self.data.nbytes + (0 if self.scales is None else self.scales.nbytes)

    def matmul(self, x: torch.Tensor, bias: torch.Tensor | None = None, activation: str | None = None) -> torch.Tensor:
        """x [rows, inputs] fp32 contiguous times the weight transposed: [rows, outputs], plus `bias`
        (fp32 [outputs], contiguous) and through `activation` (EPILOGUE_ACTIVATIONS), both applied in
        the product's epilogue."""
        assert _native is not None
        out = x.new_empty(x.shape[0], self.outputs)
        _native.matmul(x.data_ptr(), x.shape[0], self.data.data_ptr(), _pointer(self.scales), FORMATS[self.format][0],
                       self.layout, self.inputs, out.data_ptr(), self.outputs, torch.get_num_threads(),
                       _pointer(bias), EPILOGUE_ACTIVATIONS[activation])
        return out

    def rows(self, index: torch.Tensor | list[int]) -> torch.Tensor:
        """Rows of the weight in fp32 (an embedding lookup, or the LM head's label rows), widened
        natively: by rows, or from panels (an LM head's, its embedding's)."""
        assert _native is not None
        index = torch.as_tensor(index, dtype=torch.long)
        ids = index.reshape(-1).contiguous()
        format = self.format
        if self.layout == PANELS:
            assert format != "bf16x3", "rows are not gathered from bf16x3's two packings"
            format = "bfloat16" if format == "bf16x2" else format  # its one packing is bf16's
        out = torch.empty(*index.shape, self.inputs)
        _native.rows_of(self.data.data_ptr(), _pointer(self.scales), FORMATS[format][0], self.inputs, self.outputs,
                        ids.data_ptr(), len(ids), out.data_ptr(), self.layout)  # IndexError for an id out of range
        return out


def bf16_exact(weight: torch.Tensor) -> bool:
    """Whether bf16 holds every element of an fp32 weight exactly (a bf16 checkpoint's): no bit
    below a bf16's. Looked at in blocks of rows (its first row first, which settles it for an fp32
    checkpoint's weight): a whole head's mask in one tensor took 3x as long. A bf16 weight (loaded
    as the checkpoint holds it) is."""
    if weight.dtype == torch.bfloat16:
        return True
    if weight.dtype != torch.float32 or weight.dim() != 2:
        return False
    bits = weight.contiguous().view(torch.int32)
    starts = [0, 1, *range(EXACT_BLOCK, bits.shape[0], EXACT_BLOCK)]
    return not any((bits[a:b] & 0xFFFF).any() for a, b in zip(starts, [*starts[1:], bits.shape[0]]))


def _pointer(tensor: torch.Tensor | None) -> int:
    return 0 if tensor is None else tensor.data_ptr()


def storable(weight: torch.Tensor, format: str, layout: int) -> bool:
    """Whether the kernels take this weight (fp32, or a bf16 checkpoint's) in this format and layout."""
    return readable(weight) and storable_shape(format, layout, weight.shape[1])


def readable(weight: torch.Tensor) -> bool:
    """Whether the kernels store from this tensor: a 2-D fp32 or bf16 one in host memory."""
    return _native is not None and weight.device.type == "cpu" and weight.dtype in SOURCES and weight.dim() == 2


def store(weight: torch.Tensor, format: str, layout: int) -> StoredWeight:
    """`weight` ([outputs, inputs], storable: fp32, or a bf16 checkpoint's read as it is)
    converted into `format` and `layout`."""
    assert _native is not None and storable(weight, format, layout)
    code, dtype, _ = FORMATS[format]
    outputs, inputs = weight.shape
    weight = weight.contiguous()
    threads = torch.get_num_threads()
    if format in ("bf16x3", "bf16x2"):
        parts: tuple[torch.Tensor, ...] = (weight,)  # bf16x2: bf16 holds it, packing rounds it to itself
        if format == "bf16x3":
            hi = weight.to(torch.bfloat16).float()
            parts = (hi, weight.float() - hi)
        size = _native.packed_size(outputs, inputs)
        data = torch.empty(len(parts) * size, dtype=dtype)
        for half, part in enumerate(parts):
            _native.pack_linear(part.data_ptr(), outputs, inputs, FORMATS["bfloat16"][0], data[half * size:].data_ptr(),
                                0, threads, SOURCES[part.dtype])
        return StoredWeight(data, None, format, layout, outputs, inputs)
    if layout == PANELS:
        data = torch.empty(_native.packed_size(outputs, inputs), dtype=dtype)
        scales = torch.empty(_native.scales_size(outputs)) if format == "int8" else None
        _native.pack_linear(weight.data_ptr(), outputs, inputs, code, data.data_ptr(), _pointer(scales), threads,
                            SOURCES[weight.dtype])
    else:
        data = torch.empty(outputs, inputs, dtype=dtype)
        scales = torch.empty(outputs) if format == "int8" else None
        _native.convert_weight(weight.data_ptr(), outputs, inputs, code, data.data_ptr(), _pointer(scales), threads,
                               SOURCES[weight.dtype])
    return StoredWeight(data, scales, format, layout, outputs, inputs)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           stored: StoredWeight | None = None, activation: str | None = None) -> torch.Tensor:
    """x [..., in] times weight [out, in] transposed, plus bias: F.linear's contract, then
    `activation` (EPILOGUE_ACTIVATIONS; on the native kernels, bias and activation run in the
    product's epilogue). `stored`: the weight as the kernels keep it (then `weight` may be
    empty: it was dropped)."""
    width = x.shape[-1]
    rows = x.numel() // width if width else 0
    native = x.dtype == torch.float32 and x.is_cpu and rows > 0 and not torch.is_grad_enabled()
    if stored is None:
        if not native or not storable(weight, "float32", BY_ROWS) or rows > MAX_SKINNY_ROWS:
            return _activated(F.linear(x, weight, bias), activation)
        stored = StoredWeight(weight.contiguous(), None, "float32", BY_ROWS, *weight.shape)
    elif not native:
        return _activated(F.linear(x, dequantized(stored).to(x.dtype), bias), activation)
    if x.dim() == 2:  # an encoder's and a step's rows: no view to make on either side
        return stored.matmul(x.contiguous(), bias, activation)
    return stored.matmul(x.reshape(rows, width).contiguous(), bias, activation).view(*x.shape[:-1], stored.outputs)


def _activated(out: torch.Tensor, activation: str | None) -> torch.Tensor:
    """torch's own form of an epilogue activation, where the kernels do not run the product."""
    return F.gelu(out) if activation == "gelu" else out


def dequantized(stored: StoredWeight) -> torch.Tensor:
    """The weight back in fp32 [outputs, inputs] (a product the kernels do not take)."""
    eye = torch.eye(stored.inputs)
    with torch.no_grad():
        return stored.matmul(eye).t().contiguous()
