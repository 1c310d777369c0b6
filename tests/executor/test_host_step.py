"""A step's rows flattened into token columns: the native flattening against the Python one,
and both against positions and slots worked out by hand."""
from __future__ import annotations

import random

import pytest
import torch

from prelude.contract.batch import DecodeRow, OutputSpec, PrefillRow
from prelude.executor import host_step as module
from prelude.executor.host_step import host_step

BS = 4
SPEC = OutputSpec(pooling="last")

native = pytest.mark.skipif(module.flatten_tokens is None, reason="the native CPU kernels are not built")


def _python(prefills, decodes, bs=BS) -> torch.Tensor:
    return torch.tensor(module.flatten_in_python(prefills, decodes, bs)).view(3, -1)


@pytest.mark.parametrize("flattening", ["native", "python"])
def test_columns_by_hand(flattening, monkeypatch):
    if flattening == "python":
        monkeypatch.setattr(module, "flatten_tokens", None)
    elif module.flatten_tokens is None:
        pytest.skip("the native CPU kernels are not built")
    # A prompt continuing 5 cached tokens whose table covers only up to position 8, an item row,
    # and a decode row.
    rows = [PrefillRow(0, [11, 12, 13, 14, 15], 5, [7, 3], SPEC),
            PrefillRow(1, [21, 22, 23, 24, 25], 0, [9, 8], OutputSpec(label_token_ids=(1,)), item_lengths=(2, 1))]
    step = host_step(rows, [DecodeRow(2, 31, 6, [4, 5], SPEC)], BS)
    assert step.ids.tolist() == [11, 12, 13, 14, 15, 21, 22, 23, 24, 25, 31]
    # The item row: a shared part of 2 tokens, then items of 2 and 1 tokens, each from position 2.
    assert step.positions.tolist() == [5, 6, 7, 8, 9, 0, 1, 2, 3, 2, 6]
    assert step.slots.tolist() == [3 * 4 + 1, 3 * 4 + 2, 3 * 4 + 3, -1, -1, 36, 37, 38, 39, 32, 5 * 4 + 2]
    assert step.starts == [0, 5, 10, 11] and step.stored == [False, True, True]
    assert step.num_tokens == 11 and step.num_rows == 3


@native
def test_native_columns_equal_the_python_ones_on_random_steps():
    rng = random.Random(0)
    for _ in range(300):
        prefills = []
        for seq in range(rng.randrange(0, 4)):
            start = rng.randrange(0, 3 * BS)
            n = rng.randrange(1, 4 * BS)
            table = [rng.randrange(100) for _ in range(rng.randrange(0, (start + n) // BS + 2))]
            items: tuple[int, ...] = ()
            if rng.random() < 0.3 and n > 2:
                items = (1, n - 2) if rng.random() < 0.5 else (n - 1,)
            prefills.append(PrefillRow(seq, [rng.randrange(50_000) for _ in range(n)], start, table, SPEC,
                                       item_lengths=items))
        decodes = []
        for seq in range(rng.randrange(0, 4)):
            position = rng.randrange(0, 3 * BS)
            decodes.append(DecodeRow(10 + seq, rng.randrange(50_000), position,
                                     [rng.randrange(100) for _ in range(position // BS + 1)], SPEC))
        assert torch.equal(host_step(prefills, decodes, BS).tokens, _python(prefills, decodes))


@pytest.mark.parametrize("flattening", ["native", "python"])
def test_an_empty_step_has_no_columns(flattening, monkeypatch):
    if flattening == "python":
        monkeypatch.setattr(module, "flatten_tokens", None)
    step = host_step([], [], BS)
    assert step.tokens.shape == (3, 0) and step.starts == [0]


@native
def test_native_refuses_a_decode_position_past_its_table():
    with pytest.raises(IndexError):
        host_step([], [DecodeRow(0, 1, 2 * BS, [3], SPEC)], BS)
