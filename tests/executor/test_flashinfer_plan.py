"""flashinfer index arrays built from a StepLayout, against hand-computed expectations."""
from __future__ import annotations

import pytest
import torch

from prelude.contract.batch import DecodeRow, PrefillRow
from prelude.model.attention import StepLayout
from prelude.executor.attention.flashinfer_plan import PagedRows, build_plan, pad_decode_rows
from prelude.executor.host_step import host_step

BS = 4


def _layout(rows, num_prefill):
    """rows: (num_new_tokens, context_len, block_table); slots follow the table, -1 past it.

    Written independently of the executor's host_step (checked against it below), so the plan
    tests do not depend on it, and able to build layouts host_step cannot (a decode row past
    its block table) for build_plan's own checks."""
    starts, slots, stored = [0], [], []
    for n, ctx, table in rows:
        starts.append(starts[-1] + n)
        row_slots = [table[p // BS] * BS + p % BS if p // BS < len(table) else -1 for p in range(ctx, ctx + n)]
        slots += row_slots
        stored.append(-1 not in row_slots)
    return StepLayout(
        query_starts=starts, context_lens=[ctx for _, ctx, _ in rows],
        block_tables=[t for _, _, t in rows], store_kv=stored, num_prefill_rows=num_prefill,
        slot_mapping=torch.tensor(slots), host_slots=slots,
    )


MIXED = [
    (5, 0, [7, 2]),  # fresh prompt, all stored
    (3, 6, [3, 9, 4]),  # chunk continuing 6 cached tokens
    (6, 4, [5]),  # OneShot prefix hit whose new tokens are not stored
    (1, 8, [1, 6, 11]),  # decode at position 8: 9 tokens in 3 pages
    (1, 3, [0]),  # decode at position 3: a full first page
]


def test_hand_built_layout_equals_the_executors_host_step():
    ours = _layout(MIXED, num_prefill=3)
    step = host_step([PrefillRow(i, [1] * n, ctx, table, None) for i, (n, ctx, table) in enumerate(MIXED[:3])],
                     [DecodeRow(3 + i, 1, ctx, table, None) for i, (_, ctx, table) in enumerate(MIXED[3:])], BS)
    theirs = step.layout(step.slots)
    assert list(theirs.query_starts) == list(ours.query_starts)
    assert list(theirs.context_lens) == list(ours.context_lens)
    assert [list(t) for t in theirs.block_tables] == [list(t) for t in ours.block_tables]
    assert list(theirs.store_kv) == list(ours.store_kv) == [True, True, False, True, True]
    assert theirs.num_prefill_rows == ours.num_prefill_rows
    assert theirs.host_slots is not None and theirs.host_slots.tolist() == list(ours.host_slots)
    assert torch.equal(theirs.slot_mapping, ours.slot_mapping)


def test_mixed_step_with_fresh_prefix_partial_and_decode_rows():
    layout = _layout(MIXED, num_prefill=3)
    plan = build_plan(layout, BS, layout.host_slots)
    assert plan.num_prefill_tokens == 14
    assert plan.ragged_indptr == [0, 5, 8, 14]
    assert plan.prefix_rows == [1, 2]
    assert plan.prefix_qo_indptr == [0, 3, 9]
    assert plan.prefix_kv == PagedRows([0, 2, 3], [3, 9, 5], [2, 4])
    assert plan.prefix_tokens == list(range(5, 14))
    assert plan.prefix_span == (5, 14)
    assert plan.decode_kv == PagedRows([0, 3, 4], [1, 6, 11, 0], [1, 4])
    assert plan.num_decode_rows == 2
    assert not plan.store_all
    assert plan.store_tokens == list(range(0, 8)) + [14, 15]


def test_scattered_prefix_rows_have_no_span_and_all_stored_needs_no_token_list():
    layout = _layout([(2, 4, [8, 3]), (3, 0, [1]), (2, 2, [6])], num_prefill=3)
    plan = build_plan(layout, BS)
    assert plan.store_all and plan.store_tokens == []
    assert plan.prefix_rows == [0, 2]
    assert plan.prefix_tokens == [0, 1, 5, 6]
    assert plan.prefix_span is None
    assert plan.prefix_kv == PagedRows([0, 1, 2], [8, 6], [4, 2])
    assert plan.decode_kv == PagedRows() and plan.num_decode_rows == 0


def test_pure_decode_step():
    layout = _layout([(1, 0, [4]), (1, 15, [2, 3, 5, 9])], num_prefill=0)
    plan = build_plan(layout, BS)
    assert plan.num_prefill_tokens == 0 and plan.ragged_indptr == [0]
    assert plan.decode_kv == PagedRows([0, 1, 5], [4, 2, 3, 5, 9], [1, 4])


def test_short_block_table_is_an_error():
    layout = _layout([(1, 8, [1, 6])], num_prefill=0)
    with pytest.raises(ValueError, match="decode row 0"):
        build_plan(layout, BS)


def test_pad_decode_rows_to_bucket():
    kv = PagedRows([0, 3, 4], [1, 6, 11, 0], [1, 4])
    padded = pad_decode_rows(kv, 4, dummy_page=99)
    assert padded == PagedRows([0, 3, 4, 5, 6], [1, 6, 11, 0, 99, 99], [1, 4, 1, 1])
    assert pad_decode_rows(kv, 2, 99) == kv
    with pytest.raises(ValueError):
        pad_decode_rows(kv, 1, 99)
