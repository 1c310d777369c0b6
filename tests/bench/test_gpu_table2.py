"""The GPU table's MFU column: FLOPs per prompt token from a model's config."""
from __future__ import annotations

import pytest

from bench.serving.gpu_table2 import flops_per_prompt_token

QWEN3_06B = {"hidden_size": 1024, "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8,
             "head_dim": 128, "intermediate_size": 3072}


def test_qwen3_06b_costs_about_088_gflop_per_token_in_its_linear_layers():
    # Issue #14's figure for 512-token scoring: ~0.88 GFLOP per token of linear work; causal
    # attention over 512 tokens adds 2 products x 2 FLOPs x 2,048 x 256 keys x 28 layers.
    linear = flops_per_prompt_token(QWEN3_06B, 0)
    assert linear == pytest.approx(0.881e9, rel=1e-3)
    assert flops_per_prompt_token(QWEN3_06B, 512) - linear == 28 * 2 * 2 * 2048 * 256
