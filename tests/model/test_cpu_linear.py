"""The native CPU linear gives what F.linear gives, for every row count, output size, thread count
and input shape it may meet, with and without the weight's packed copy."""
from __future__ import annotations

import pytest
import torch

from prelude.model.cpu_linear import MAX_SKINNY_ROWS, PackedWeight, built, linear


def test_the_native_kernel_is_built():
    # `pip install -e .` builds it; a silent fallback to torch would hide a 2-5x slower decode.
    assert built


@pytest.mark.parametrize("vocab", [1, 7, 1000, 1 << 16 | 3])
@pytest.mark.parametrize("rows", [1, 2, 3, 8, 17, MAX_SKINNY_ROWS, MAX_SKINNY_ROWS + 1])
def test_equals_the_matmul(vocab: int, rows: int):
    gen = torch.Generator().manual_seed(vocab * 100 + rows)
    weight = torch.randn(vocab, 64, generator=gen)
    hidden = torch.randn(rows, 64, generator=gen)
    for packed in (None, PackedWeight()):
        out = linear(hidden, weight, packed=packed)
        assert out.shape == (rows, vocab) and out.is_contiguous()
        torch.testing.assert_close(out, hidden @ weight.t(), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_threads_split_the_vocabulary_without_seams(threads: int):
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        weight = torch.randn(4099, 256)  # large enough to be split; not a multiple of 4 rows or 16 outputs
        for rows in (5, 67):  # a few rows stream the weight, more go through its packed copy
            hidden = torch.randn(rows, 512)[:, ::2]  # a strided view is accepted
            torch.testing.assert_close(linear(hidden, weight, packed=PackedWeight()), hidden @ weight.t(),
                                       rtol=1e-5, atol=1e-4)
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


def test_warm_up_packs_the_layers_but_not_the_lm_head_nothing_multiplies_through(tmp_path):
    # compute_logits reads the LM head's weight directly; a packed copy of it was a second
    # vocabulary-sized weight held for nothing.
    from prelude.model.config import ModelConfig
    from prelude.model.loader import load_model
    from prelude.model.ops import select_ops
    from tests.checkpoints import make_checkpoint

    path = make_checkpoint(tmp_path / "untied", "qwen3", tie=False)
    model = load_model(path, ModelConfig.from_dir(path), torch.float32, torch.device("cpu"), max_positions=64,
                       ops=select_ops(torch.device("cpu")))
    model.prepare_weights()
    assert model.lm_head is not None and model.lm_head.packed.packed is None
    assert all(layer.mlp.down_proj.packed.packed is not None for layer in model.model.layers)
