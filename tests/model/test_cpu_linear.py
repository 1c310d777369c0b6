"""The native CPU linear gives what F.linear gives, for every row count, output size, thread count
and input shape it may meet, by rows and packed, in fp32; in bf16 and int8 it gives the product
of the weight those formats hold (rounded to bf16; quantized per output channel)."""
from __future__ import annotations

import pytest
import torch

from prelude.model.cpu_linear import (BY_ROWS, HEAD_LAYOUTS, MAX_SKINNY_ROWS, PANELS, SPLIT_PRODUCTS, built,
                                      dequantized, linear, storable, store)

try:
    from kernels.cpu._native import bf16_products, int8_products
    INT8_PRODUCTS, BF16_PRODUCTS = int8_products(), bf16_products()
except ImportError:
    INT8_PRODUCTS = BF16_PRODUCTS = False


def test_the_native_kernel_is_built():
    # `pip install -e .` builds it; a silent fallback to torch would hide a 2-5x slower decode.
    assert built


def _rounded(weight: torch.Tensor, format: str) -> torch.Tensor:
    """What a format holds of an fp32 weight (int8: of each row, as the kernels quantize rows)."""
    if format == "bfloat16":
        return weight.bfloat16().float()
    if format == "int8":  # scale max |w| / 127 per output; q rounded half away from zero
        scale = weight.abs().amax(dim=1, keepdim=True) / 127
        q = (weight * (1 / scale)).clamp(-127, 127)
        return (q + torch.where(q < 0, -0.5, 0.5)).trunc() * scale
    return weight


def _product(hidden: torch.Tensor, weight: torch.Tensor, format: str, layout: int) -> torch.Tensor:
    """What the kernels compute: by the weight the format holds, and with a packed weight's
    products in its own arithmetic (int8 on a CPU with VNNI, bf16 with AVX-512 BF16) of rows
    rounded to the format too."""
    narrow_rows = layout == PANELS and {"int8": INT8_PRODUCTS, "bfloat16": BF16_PRODUCTS}.get(format, False)
    return (_rounded(hidden, format) if narrow_rows else hidden) @ _rounded(weight, format).t()


@pytest.mark.parametrize("vocab", [1, 7, 1000, 1 << 16 | 3])
@pytest.mark.parametrize("rows", [1, 2, 3, 8, 17, MAX_SKINNY_ROWS, MAX_SKINNY_ROWS + 1])
def test_equals_the_matmul(vocab: int, rows: int):
    gen = torch.Generator().manual_seed(vocab * 100 + rows)
    weight = torch.randn(vocab, 64, generator=gen)
    hidden = torch.randn(rows, 64, generator=gen)
    for stored in (None, store(weight, "float32", PANELS)):
        out = linear(hidden, weight, stored=stored)
        assert out.shape == (rows, vocab) and out.is_contiguous()
        torch.testing.assert_close(out, hidden @ weight.t(), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("format", ["float32", "bfloat16", "int8"])
@pytest.mark.parametrize("layout", [BY_ROWS, PANELS])
@pytest.mark.parametrize("rows", [1, 6, 7, 200, 400])  # streamed, one tile, tiles, row blocks
@pytest.mark.parametrize("activation", [None, "gelu"])
def test_the_epilogue_adds_the_bias_then_the_activation(format: str, layout: int, rows: int, activation: str | None):
    gen = torch.Generator().manual_seed(rows)
    weight, bias = torch.randn(1000, 384, generator=gen) / 8, torch.randn(1000, generator=gen)  # a part panel
    hidden = torch.randn(rows, 384, generator=gen)
    out = store(weight, format, layout).matmul(hidden, bias, activation)
    expected = _product(hidden, weight, format, layout) + bias
    if activation == "gelu":
        expected = torch.nn.functional.gelu(expected)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("format", ["float32", "bfloat16", "int8"])
@pytest.mark.parametrize("layout", [BY_ROWS, PANELS])
# By rows the stream takes 1-3 rows in one pass; fp32 and bf16 panels stream up to 32 rows (on
# AVX2) in even tiles.
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 6, 7, 9, 12, 13, 21, 32, 33, 40, 200])
def test_each_format_multiplies_by_the_weight_it_holds(format: str, layout: int, rows: int):
    gen = torch.Generator().manual_seed(rows)
    weight = torch.randn(1003, 64 if layout == BY_ROWS else 520, generator=gen)  # not whole panels
    hidden = torch.randn(rows, weight.shape[1], generator=gen)
    stored = store(weight, format, layout)
    torch.testing.assert_close(stored.matmul(hidden), _product(hidden, weight, format, layout), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(dequantized(stored), _rounded(weight, format), rtol=1e-5, atol=1e-5)
    ids = torch.tensor([0, 5, 1002, 5])  # an embedding's lookups, from either layout (a head's)
    torch.testing.assert_close(stored.rows(ids), _rounded(weight, format)[ids], rtol=1e-5, atol=1e-5)
    assert stored.rows(ids.view(2, 2)).shape == (2, 2, weight.shape[1])
    with pytest.raises(IndexError):  # checked by the native lookup before it reads
        stored.rows(torch.tensor([0, 1003]))


@pytest.mark.parametrize("format", ["float32", "bfloat16", "int8"])
@pytest.mark.parametrize("rows", [16, 17, 32, 33])  # an LM head's panels stream more rows than a layer's
def test_a_head_wide_weight_in_panels_gives_the_product_around_its_stream_limit(format: str, rows: int):
    gen = torch.Generator().manual_seed(rows)
    weight = torch.randn(32768 + 5, 64, generator=gen)
    hidden = torch.randn(rows, 64, generator=gen)
    stored = store(weight, format, PANELS)
    torch.testing.assert_close(stored.matmul(hidden), _product(hidden, weight, format, PANELS), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5])
def test_an_fp32_weight_by_rows_the_wide_kernels_do_not_take(rows: int):
    """Rows 72 long (an odd multiple of 8: no sixteen-lane kernel takes them, and each ends with
    a half group): the eight-lane stream's one to three rows of x in one pass, its four, and
    past them, on any CPU."""
    gen = torch.Generator().manual_seed(rows)
    weight, hidden = torch.randn(1003, 72, generator=gen), torch.randn(rows, 72, generator=gen)
    torch.testing.assert_close(store(weight, "float32", BY_ROWS).matmul(hidden), hidden @ weight.t(),
                               rtol=1e-4, atol=1e-4)


def test_int8_stores_a_quarter_and_bf16_half_of_fp32():
    weight = torch.randn(512, 256)
    sizes = {f: store(weight, f, PANELS).nbytes for f in ("float32", "bfloat16", "int8")}
    assert sizes["bfloat16"] * 2 == sizes["float32"]
    assert sizes["int8"] == sizes["float32"] // 4 + 512 * 8  # and a scale and a weight sum per output


@pytest.mark.parametrize("threads", [1, 2, 3])
@torch.inference_mode()  # the server's mode: with autograd on, linear() leaves products to torch
def test_threads_split_the_vocabulary_without_seams(threads: int):
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        weight = torch.randn(4099, 256)  # large enough to be split; not a multiple of 4 rows or 16 outputs
        for format in ("float32", "int8"):
            stored = store(weight, format, PANELS)
            for rows in (5, 67):  # a few rows stream the panels, more go through register tiles
                hidden = torch.randn(rows, 512)[:, ::2]  # a strided view is accepted
                torch.testing.assert_close(linear(hidden, torch.empty(0), stored=stored),
                                           _product(hidden.contiguous(), weight, format, PANELS), rtol=1e-4, atol=1e-4)
    finally:
        torch.set_num_threads(before)


def test_shapes_it_does_not_cover_fall_back():
    weight = torch.randn(100, 12)  # width not a multiple of 8
    hidden = torch.randn(3, 12)
    torch.testing.assert_close(linear(hidden, weight), hidden @ weight.t())
    assert linear(hidden[:0], weight).shape == (0, 100)
    half = torch.randn(3, 16, dtype=torch.bfloat16)
    assert linear(half, torch.randn(100, 16, dtype=torch.bfloat16)).dtype == torch.bfloat16


def test_bias_and_leading_dimensions_follow_f_linear():
    weight, bias = torch.randn(40, 16), torch.randn(40)
    x = torch.randn(2, 3, 16)
    torch.testing.assert_close(linear(x, weight, bias), torch.nn.functional.linear(x, weight, bias),
                               rtol=1e-5, atol=1e-5)
    stored = store(weight, "float32", PANELS)
    torch.testing.assert_close(linear(x, torch.empty(0), bias, stored), torch.nn.functional.linear(x, weight, bias),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("format", ["float32", "bfloat16", "int8"])
def test_loading_keeps_one_copy_of_each_weight(tmp_path, format: str):
    # The layers keep only their packed weights; the embedding and an untied LM head are kept
    # for the kernels too (and nothing of their fp32 copies) unless an fp32 head stays by rows,
    # where the checkpoint's weight is what the kernels read.
    from prelude.model.config import ModelConfig
    from prelude.model.loader import load_model
    from prelude.model.ops import select_ops
    from tests.checkpoints import make_checkpoint

    path = make_checkpoint(tmp_path / "untied", "qwen3", tie=False)
    model = load_model(path, ModelConfig.from_dir(path), torch.float32, torch.device("cpu"), max_positions=64,
                       ops=select_ops(torch.device("cpu")), weight_format=format)
    for layer in model.model.layers:
        for linear_ in (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj):
            assert linear_.stored is not None and linear_.stored.layout == PANELS and linear_.weight.numel() == 0
    assert model.lm_head is not None
    kept = format != "float32" or HEAD_LAYOUTS.get(format, BY_ROWS) == PANELS
    assert (model.lm_head.stored is not None) == kept and (model.lm_head.weight.numel() == 0) == kept
    assert (model.model.embed_tokens.stored is not None) == kept
    if format == "int8":  # the head through the panel kernels, its lookups gathered from them
        assert model.lm_head.stored is not None and model.lm_head.stored.layout == PANELS


@pytest.mark.parametrize("format, layout", [("float32", PANELS), ("float32", BY_ROWS), ("bfloat16", PANELS),
                                            ("bfloat16", BY_ROWS), ("int8", PANELS), ("int8", BY_ROWS),
                                            ("bf16x2", PANELS), ("bf16x3", PANELS)])
def test_a_bf16_weight_is_stored_as_its_fp32_copy_is(format: str, layout: int):
    # A bf16 checkpoint's weights are stored from its own tensors (model.loader), never widened to
    # fp32 first: the kernels' copy is the fp32 copy's, byte for byte (a part panel: 37 outputs).
    weight = (torch.randn(37, 64) / 8).bfloat16()
    if not storable(weight, format, layout):
        pytest.skip(f"{format} takes no weight in this layout on this CPU")
    narrow, wide = store(weight, format, layout), store(weight.float(), format, layout)
    assert narrow.format == wide.format and torch.equal(narrow.data.view(torch.uint8), wide.data.view(torch.uint8))
    if wide.scales is not None:
        assert narrow.scales is not None and torch.equal(narrow.scales.view(torch.int32), wide.scales.view(torch.int32))


@pytest.mark.parametrize("format, switch", [("int8", "PRELUDE_CPU_INT8_PRODUCTS"),
                                            ("bfloat16", "PRELUDE_CPU_BF16_PRODUCTS")])
def test_narrow_weights_alone_where_their_products_are_off_or_missing(format: str, switch: str):
    # PRELUDE_CPU_INT8_PRODUCTS=0 / PRELUDE_CPU_BF16_PRODUCTS=0 (or a CPU without VNNI / AVX-512
    # BF16): the weights widened and computed in fp32, every row count through the streaming and
    # the blocked paths. Run in a process of its own: the kernels decide once per process.
    import os
    import subprocess
    import sys

    script = f"""
import torch
from kernels.cpu._native import bf16_products, int8_products
from prelude.model.cpu_linear import PANELS, store
from tests.model.test_cpu_linear import _rounded
assert not {{"int8": int8_products, "bfloat16": bf16_products}}["{format}"]()
gen = torch.Generator().manual_seed(0)
weight = torch.randn(1003, 520, generator=gen)
stored = store(weight, "{format}", PANELS)
with torch.inference_mode():
    for rows in (1, 5, 6, 7, 40, 200):
        hidden = torch.randn(rows, 520, generator=gen)
        expected = hidden @ _rounded(weight, "{format}").t()
        torch.testing.assert_close(stored.matmul(hidden), expected, rtol=1e-4, atol=1e-4)
"""
    env = dict(os.environ, **{switch: "0"})
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("amx", ["1", "0"])
@pytest.mark.parametrize("format", ["bfloat16", "int8"])
def test_tiles_and_the_vector_kernels_give_the_same_products(amx: str, format: str):
    # Whole 16-row tiles go to AMX where the CPU has it (PRELUDE_CPU_AMX=0 sends them to the
    # AVX-512 BF16 / VNNI kernels): either way each row's products are its rounded (bf16) or
    # quantized (int8, per row) row times the weight as stored, for tile pairs, lone tiles, a
    # part panel and the rows past the last whole tile. A process of its own per setting: the
    # kernels decide once per process.
    import os
    import subprocess
    import sys

    if not {"bfloat16": BF16_PRODUCTS, "int8": INT8_PRODUCTS}[format]:
        pytest.skip(f"this CPU has no {format} products: its weights are widened (tested above)")
    script = f"""
import torch
from kernels.cpu._native import amx_products
from prelude.model.cpu_linear import PANELS, store
from tests.model.test_cpu_linear import _rounded
print(amx_products())
gen = torch.Generator().manual_seed(0)
weight, bias = torch.randn(1000, 384, generator=gen) / 8, torch.randn(1000, generator=gen)
stored = store(weight, "{format}", PANELS)
with torch.inference_mode():
    for rows in (15, 16, 17, 32, 48, 200, 333):
        hidden = torch.randn(rows, 384, generator=gen)
        product = _rounded(hidden, "{format}") @ _rounded(weight, "{format}").t()
        expected = torch.nn.functional.gelu(product + bias)
        torch.testing.assert_close(stored.matmul(hidden, bias, "gelu"), expected, rtol=1e-5, atol=1e-4)
"""
    env = dict(os.environ, PRELUDE_CPU_AMX=amx)
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    if amx == "0":
        assert done.stdout.strip() == "False"


@pytest.mark.skipif(not SPLIT_PRODUCTS, reason="bf16x3 runs on AMX, which this CPU (or process) lacks")
# A decode step's few rows stream the panels (1-7: one and two groups of four), more go to the
# tiles: a padded tile, tiles, tile pairs, row blocks.
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 7, 8, 15, 16, 17, 33, 200, 352, 1001])
@pytest.mark.parametrize("shape", [(1000, 384), (384, 1536), (40, 64)])  # a part panel, long k, a lone panel
def test_bf16x3_gives_the_fp32_product_to_within_two_to_the_minus_16(rows: int, shape: tuple[int, int]):
    # The weight split into bf16 halves: on the tiles each row split alike, three products; a few
    # rows multiply the halves' sum in fp32. Every row agrees with the fp64 product to a few 1e-6
    # of its largest term, where bf16 alone is off by ~1e-2; bias and GELU follow as for the other
    # formats.
    gen = torch.Generator().manual_seed(rows)
    weight, bias = torch.randn(*shape, generator=gen) / 8, torch.randn(shape[0], generator=gen)
    hidden = torch.randn(rows, shape[1], generator=gen)
    stored = store(weight, "bf16x3", PANELS)
    assert stored.nbytes == store(weight, "float32", PANELS).nbytes
    exact = (hidden.double() @ weight.double().t()).float()
    out = stored.matmul(hidden)
    assert out.shape == (rows, shape[0])
    assert ((out - exact).abs().max() / exact.abs().max()).item() < 2 ** -16
    torch.testing.assert_close(stored.matmul(hidden, bias, "gelu"), torch.nn.functional.gelu(exact + bias),
                               rtol=1e-4, atol=1e-4)


def _bf16x2_products(rows_list: tuple[int, ...], shape: tuple[int, int]) -> None:
    """A bf16 checkpoint's weight served in fp32 (it holds no bit below a bf16's) keeps one bf16
    packing (bf16x2), half fp32's bytes, and gives fp32's products: on AMX bf16x3's very sums
    (its rest is zero), elsewhere the panels widened into fp32 arithmetic. Bias and GELU follow."""
    from prelude.model.layers import Linear

    gen = torch.Generator().manual_seed(shape[0])
    weight = (torch.randn(*shape, generator=gen) / 8).to(torch.bfloat16).float()
    bias = torch.randn(shape[0], generator=gen)
    layer = Linear(shape[1], shape[0])
    layer.weight.data = weight.clone()
    layer.store("bf16x3" if SPLIT_PRODUCTS else "float32")
    assert layer.stored is not None and layer.stored.format == "bf16x2"
    assert 2 * layer.stored.nbytes == store(weight, "float32", PANELS).nbytes
    split = store(weight, "bf16x3", PANELS) if SPLIT_PRODUCTS else None
    with torch.inference_mode():
        for rows in rows_list:
            hidden = torch.randn(rows, shape[1], generator=gen)
            exact = (hidden.double() @ weight.double().t()).float()
            out = layer(hidden)
            error = ((out - exact).abs().max() / exact.abs().max()).item()
            assert error < (2 ** -16 if SPLIT_PRODUCTS else 2e-6), (rows, error)
            torch.testing.assert_close(layer.stored.matmul(hidden, bias, "gelu"),
                                       torch.nn.functional.gelu(exact + bias), rtol=1e-4, atol=1e-4)
            if split is not None:
                assert torch.equal(out, split.matmul(hidden))
                assert torch.equal(layer.stored.matmul(hidden, bias, "gelu"), split.matmul(hidden, bias, "gelu"))


# A decode step's rows (1-7: streamed) and more (tiles where the CPU has AMX; register tiles
# of widened panels elsewhere); a part panel with a k the tiles take, and a lone panel.
BF16X2_ROWS = (1, 3, 4, 5, 8, 17, 33, 352)


@pytest.mark.parametrize("shape", [(1000, 384), (40, 64)])
def test_a_weight_bf16_holds_exactly_keeps_one_packing_and_fp32s_products(shape: tuple[int, int]):
    _bf16x2_products(BF16X2_ROWS, shape)


@pytest.mark.parametrize("shape", [(1003, 96), (40, 64)])
def test_a_bf16x2_weights_rows_are_gathered_from_its_panels(shape: tuple[int, int]):
    # Without AMX a bf16 checkpoint's LM head and tied embedding are kept in bf16x2 panels, from
    # which lookups gather their rows (a part panel: 1003 outputs).
    weight = (torch.randn(*shape) / 8).to(torch.bfloat16).float()
    stored = store(weight, "bf16x2", PANELS)
    index = torch.tensor([[0, 15, 16], [shape[0] - 1, 7, 7]])
    assert torch.equal(stored.rows(index), weight[index])
    assert torch.equal(stored.rows(list(range(shape[0]))), weight)
    for outside in (shape[0], -1):  # the last panel's padding (1003 outputs), and a negative id
        with pytest.raises(IndexError):
            stored.rows([0, outside])


def test_without_amx_a_bf16x2_weight_is_widened_into_fp32_products():
    # PRELUDE_CPU_AMX=0, in a process of its own (the kernels decide once per process); also a k
    # the tiles do not take whole (40), which widens on any CPU.
    import os
    import subprocess
    import sys

    script = f"""
from tests.model.test_cpu_linear import _bf16x2_products
for shape in ((1000, 384), (40, 64), (64, 40)):
    _bf16x2_products({BF16X2_ROWS}, shape)
"""
    env = dict(os.environ, PRELUDE_CPU_AMX="0")
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("rows", [11, 12, 13, 16, 17, 63, 64, 65, 100, 257])
@pytest.mark.parametrize("shape", [(1003, 96), (4096, 512)])  # a part panel pair; a head's width
def test_a_bf16_weight_by_rows_gives_fp32s_products_for_many_rows(rows: int, shape: tuple[int, int]):
    # A bf16 LM head (kept by rows for its lookups): a few rows stream it, many go to AMX's tiles
    # where the CPU has them (kernels/cpu/head_tiles.hpp: each row split in halves, the weight's
    # rows gathered into panels). Either way every row within 2^-16 of the fp64 product.
    gen = torch.Generator().manual_seed(rows)
    weight = (torch.randn(*shape, generator=gen) / 8).to(torch.bfloat16).float()
    stored = store(weight, "bfloat16", BY_ROWS)
    hidden = torch.randn(rows, shape[1], generator=gen)
    exact = (hidden.double() @ weight.double().t()).float()
    out = stored.matmul(hidden)
    assert ((out - exact).abs().max() / exact.abs().max()).item() < 2 ** -16


def test_a_weight_off_bf16s_grid_keeps_both_halves():
    from prelude.model.layers import Linear

    weight = (torch.randn(64, 64) / 8).to(torch.bfloat16).float()
    weight[-1, -1] += weight[-1, -1].abs() * 2 ** -12 + 1e-6  # one element between two bf16s
    layer = Linear(64, 64)
    layer.weight.data = weight
    layer.store("bf16x3" if SPLIT_PRODUCTS else "float32")
    assert layer.stored is not None and layer.stored.format == ("bf16x3" if SPLIT_PRODUCTS else "float32")


def test_a_layer_whose_k_the_tiles_do_not_take_whole_stays_fp32():
    from prelude.model.layers import Linear

    layer = Linear(48, 64)
    layer.weight.data = torch.randn(64, 48)
    hidden = torch.randn(5, 48)
    expected = hidden @ layer.weight.data.t()
    layer.store("bf16x3")
    assert not storable(torch.zeros(64, 48), "bf16x3", PANELS)
    assert layer.stored is not None and layer.stored.format == "float32"
    torch.testing.assert_close(layer(hidden), expected, rtol=1e-5, atol=1e-5)


def test_an_arrays_address_is_where_numpy_says_its_data_starts():
    # The kernels take arrays by address (kernels.cpu.addresses); a view's is its first element's.
    import numpy as np

    from kernels.cpu.addresses import address_of

    whole = np.arange(24, dtype=np.float32).reshape(4, 6)
    read_only = whole.copy()
    read_only.flags.writeable = False
    for array in (whole, whole[1], whole[:, 2:], whole[::2, ::-1], read_only, np.empty((0, 6), np.int64)):
        assert address_of(array) == array.ctypes.data
    assert address_of(None) == 0
