"""The native CPU LM head gives the logits `hidden @ W.t()` gives, for every row count, vocabulary
size and thread count it may meet."""
from __future__ import annotations

import pytest
import torch

from prelude.model.lm_head import MAX_SKINNY_ROWS, lm_head_logits, skinny_matmul


def test_the_native_kernel_is_built():
    # `pip install -e .` builds it; a silent fallback to torch would hide a 2-5x slower decode.
    assert skinny_matmul is not None


@pytest.mark.parametrize("vocab", [1, 7, 1000, 1 << 16 | 3])
@pytest.mark.parametrize("rows", [1, 2, 3, 8, 17, MAX_SKINNY_ROWS, MAX_SKINNY_ROWS + 1])
def test_equals_the_matmul(vocab: int, rows: int):
    gen = torch.Generator().manual_seed(vocab * 100 + rows)
    weight = torch.randn(vocab, 64, generator=gen)
    hidden = torch.randn(rows, 64, generator=gen)
    out = lm_head_logits(hidden, weight)
    assert out.shape == (rows, vocab) and out.is_contiguous()
    torch.testing.assert_close(out, hidden @ weight.t(), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_threads_split_the_vocabulary_without_seams(threads: int):
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        weight = torch.randn(4099, 256)  # large enough to be split; not a multiple of 4 rows
        hidden = torch.randn(5, 512)[:, ::2]  # a strided view is accepted
        torch.testing.assert_close(lm_head_logits(hidden, weight), hidden @ weight.t(), rtol=1e-5, atol=1e-4)
    finally:
        torch.set_num_threads(before)


def test_shapes_it_does_not_cover_fall_back():
    weight = torch.randn(100, 12)  # width not a multiple of 8
    hidden = torch.randn(3, 12)
    torch.testing.assert_close(lm_head_logits(hidden, weight), hidden @ weight.t())
    assert lm_head_logits(hidden[:0], weight).shape == (0, 100)
    half = torch.randn(3, 16, dtype=torch.bfloat16)
    assert lm_head_logits(half, torch.randn(100, 16, dtype=torch.bfloat16)).dtype == torch.bfloat16
