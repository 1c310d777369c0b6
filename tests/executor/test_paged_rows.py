"""A step's rows over the paged cache (flat_step.paged_rows): the native layout against the Python
one, and both against tables cut and padded by hand."""
from __future__ import annotations

import random

import pytest

from prelude.executor import flat_step as module
from prelude.executor.flat_step import paged_rows

BS = 4


@pytest.mark.parametrize("layout", ["native", "python"])
def test_tables_by_hand(layout, monkeypatch):
    if layout == "python":
        monkeypatch.setattr(module, "paged_tables", None)
    elif module.paged_tables is None:
        pytest.skip("the native CPU kernels are not built")
    # A prompt of 5 over 5 cached tokens (3 blocks of its 4), a prompt of one stored token (a
    # decode-shaped row before the decode rows), a decode row at position 6 (2 blocks of its 3).
    rows = paged_rows([0, 5, 6, 7], [5, 3, 6], [[7, 3, 2, 9], [1], [4, 5, 8]], [True, True, True], None, BS)
    assert rows.decode_from == 1
    assert rows.width == 3 and list(rows.tables) == [7, 3, 2, 1, 0, 0, 4, 5, 0]
    assert rows.item_starts is None and rows.item_lengths is None
    # A row that stores nothing ends the trailing decode rows; items are listed per row.
    rows = paged_rows([0, 3, 4], [0, 2], [[6], [1]], [True, False], [(1, 1), ()], BS)
    assert rows.decode_from == 2 and list(rows.tables) == [6, 1]
    assert rows.item_starts == [0, 2, 2] and rows.item_lengths == [1, 1]


@pytest.mark.skipif(module.paged_tables is None, reason="the native CPU kernels are not built")
def test_native_layout_equals_the_python_one_on_random_steps():
    rng = random.Random(7)
    for _ in range(200):
        rows = rng.randint(1, 12)
        lens = [rng.randint(0, 40) for _ in range(rows)]
        queries = [rng.choice([1, 1, rng.randint(1, 20)]) for _ in range(rows)]
        starts = [0]
        for q in queries:
            starts.append(starts[-1] + q)
        stored = [rng.random() < 0.9 for _ in range(rows)]
        tables = [[rng.randint(0, 99) for _ in range(-(-(c + q) // BS) + rng.randint(-1, 2))]
                  for c, q in zip(lens, queries)]
        native = module.paged_tables(starts, lens, tables, stored, BS)
        python = module.paged_tables_in_python(starts, lens, tables, stored, BS)
        assert (native[0], list(native[1]), native[2]) == (python[0], list(python[1]), python[2])
