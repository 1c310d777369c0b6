"""Bucket sizes and selection of the CUDA-graph runner (pure logic, no GPU needed)."""
from __future__ import annotations

from prelude.executor.cuda_graphs import GraphRunner, decode_sizes, pick_bucket, prefill_sizes

QWEN3_06B_LAYER, QWEN3_4B_LAYER = 15_728_640, 100_925_440  # one layer's projection weights


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
    sizes = prefill_sizes(8192, QWEN3_06B_LAYER)
    assert pick_bucket(128, sizes) == 128 and pick_bucket(129, sizes) == 256
    assert pick_bucket(300, sizes) == 512 and pick_bucket(1025, sizes) == 1536
    assert pick_bucket(8192, sizes) == 8192 and pick_bucket(8193, sizes) is None


def test_prefill_sizes_stop_at_the_step_budget_and_where_big_models_turn_kernel_bound():
    grid = [32, 64, 128, 256, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192]
    assert prefill_sizes(8192, QWEN3_06B_LAYER) == grid
    assert prefill_sizes(5000, QWEN3_06B_LAYER) == grid[:11] + [5000]  # every step under the budget fits
    assert prefill_sizes(8192, QWEN3_4B_LAYER) == grid[:7] + [1276]
    assert prefill_sizes(512, 1000) == grid[:4] + [512]  # a tiny model: the budget alone
    assert prefill_sizes(8192, 10**12) == [32]  # never none at all


def test_prefill_buckets_count_tokens_and_keep_a_row_for_the_padding():
    graphs = GraphRunner.__new__(GraphRunner)  # the bucket logic alone, no model or device
    graphs.decode_sizes, graphs.prefill_sizes, graphs.max_prefill_rows = decode_sizes(8), prefill_sizes(512, 1), 8
    assert graphs.bucket("decode", tokens=3, rows=3) == 4
    assert graphs.bucket("prefill", tokens=100, rows=3) == 128
    assert graphs.bucket("prefill", tokens=100, rows=8) == 128
    assert graphs.bucket("prefill", tokens=100, rows=9) is None  # more rows than a graph takes
    assert graphs.bucket("prefill", tokens=513, rows=1) is None
    # A bucket's graph has one row more than a step may bring (the padding's), or one per token.
    assert graphs.prefill_rows(128) == 9 and graphs.prefill_rows(32) == 9
    graphs.max_prefill_rows = 256
    assert graphs.prefill_rows(32) == 32 and graphs.prefill_rows(512) == 257
