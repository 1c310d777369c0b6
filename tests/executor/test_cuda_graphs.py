"""Bucket sizes and selection of the CUDA-graph runner (pure logic, no GPU needed)."""
from __future__ import annotations

from prelude.executor.cuda_graphs import PREFILL_SIZES, decode_sizes, pick_bucket


def test_decode_sizes_are_powers_of_two_capped_by_max_num_seqs():
    assert decode_sizes(1) == [1]
    assert decode_sizes(4) == [1, 2, 4]
    assert decode_sizes(96) == [1, 2, 4, 8, 16, 32, 64, 96]
    assert decode_sizes(256) == [1, 2, 4, 8, 16, 32, 64, 128, 256]


def test_pick_bucket_pads_up_and_refuses_oversize():
    sizes = decode_sizes(96)
    assert [pick_bucket(n, sizes) for n in (1, 2, 3, 5, 8, 9, 64, 65, 96)] == [1, 2, 4, 8, 8, 16, 64, 96, 96]
    assert pick_bucket(97, sizes) is None
    assert pick_bucket(0, sizes) is None
    assert pick_bucket(128, PREFILL_SIZES) == 128 and pick_bucket(129, PREFILL_SIZES) == 256
    assert pick_bucket(300, PREFILL_SIZES) == 512 and pick_bucket(1025, PREFILL_SIZES) is None
