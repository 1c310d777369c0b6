"""Which format and layout the CPU's native kernels keep each weight in, decided once for both
models that store them: the torch one (model.layers, model.cpu_linear) and the one without torch
(model.native_decoder). model.cpu_linear says what the formats are and why."""
from __future__ import annotations

from typing import TYPE_CHECKING

try:
    from kernels.cpu import _native
except ImportError:  # the extension is not built (a source checkout before `pip install -e .`)
    _native = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from prelude.model.config import ModelConfig

BY_ROWS, PANELS = 0, 1
# Each format's code in the kernels, and how many elements a by-rows weight's groups interleave
# (its rows must hold them whole).
CODES = {"float32": 0, "bfloat16": 1, "int8": 2, "bf16x3": 3, "bf16x2": 4}
GROUPS = {"float32": 1, "bfloat16": 16, "int8": 32, "bf16x3": 16, "bf16x2": 16}
# bf16x3 products run where whole tiles of rows do, on AMX; its tiles take k 32 at a time.
SPLIT_PRODUCTS = _native is not None and _native.amx_products()
SPLIT_K = 32
# An LM head's (and a tied embedding's) layout per format: by rows, except int8, which goes
# through the panel kernels (int8 products where the CPU has VNNI: B's head at one row ~2x
# faster than widened by rows), and every format on a CPU of eight-lane vectors (AVX2), whose
# panel tiles keep a decode step's rows near the weight's read where the by-rows stream is bound
# by its sums from four or five rows (B's bf16 head at 5 rows 4.6 against 6.1 ms, 10 rows 9.0
# against 12.2; fp32 at 12 rows 12.8 against 19.0, 64 rows 55 against MKL's 76; one to four fp32
# rows 1.02-1.09x the by-rows time); lookups gather from either.
HEAD_LAYOUTS = ({"int8": PANELS} if _native is None or _native.wide_vectors()
                else {"int8": PANELS, "bfloat16": PANELS, "float32": PANELS})


def stored_format(dtype: str, quantization: str, config: ModelConfig) -> str | None:
    """The format a model's weights are stored in, from --dtype and --quantization (None: not
    stored, fp16 runs on torch's ops). Activations stay fp32 whatever the weights are stored in.
    fp32 weights are kept as bf16x3 where the CPU has AMX; a checkpoint of int8 weights stays int8."""
    if quantization == "int8" or config.int8_weights:
        return "int8"
    if dtype == "float16":
        return None
    if dtype == "bfloat16":
        return "bfloat16"
    return "bf16x3" if SPLIT_PRODUCTS else "float32"


def storable_shape(format: str, layout: int, inputs: int) -> bool:
    """Whether the kernels take a weight of `inputs` columns in this format and layout."""
    if format == "bf16x3":
        return SPLIT_PRODUCTS and layout == PANELS and inputs % SPLIT_K == 0
    if format == "bf16x2":  # on the tiles where they take its k whole, else widened (linear.hpp)
        return layout == PANELS and inputs % 8 == 0
    group = GROUPS[format] if layout == BY_ROWS else 1
    return inputs % max(8, group) == 0


def placement(format: str, layout: int, exact: bool, inputs: int) -> tuple[str, int] | None:
    """The format and layout a weight asked for in `format` and `layout` is kept in, or None where
    it stays as it is (the kernels do not take it, or an fp32 weight by rows is what they read).
    `exact`: bf16 holds every element (a bf16 checkpoint's). Such a weight served in fp32 keeps
    half the bytes and fp32's products: in panels as bf16x2; an LM head and its embedding (by rows
    otherwise) as bf16 by rows where the CPU has AMX, whose tiles take a head's many rows,
    elsewhere as bf16x2 panels too, whose register tiles keep up with torch's fp32 sgemm there
    (B's head at 256 rows: 1.01-1.05x its time on AVX-512, 1.06-1.11x on AVX2) and read half its
    bytes for a decode step's few rows (one to four: 0.3-0.45x the fp32 head's time)."""
    if format in ("bf16x3", "float32") and exact:
        if layout == PANELS or not SPLIT_PRODUCTS:
            format, layout = "bf16x2", PANELS
        else:
            format = "bfloat16"
    if format in ("bf16x3", "bf16x2") and not storable_shape(format, layout, inputs):  # k the tiles do not take
        format = "float32"
    if (format == "float32" and layout == BY_ROWS) or not storable_shape(format, layout, inputs):
        return None
    return format, layout
