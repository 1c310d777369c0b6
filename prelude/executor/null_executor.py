"""An executor that does no model work: fixed logits of the right shape, through the real
flattening, output-head and sampling code. Benchmarks use it to measure everything around the
model (HTTP, admission, tokenization, scheduling, responses)."""
from __future__ import annotations

import torch
from torch import nn

from prelude.executor.attention.base import AttentionBackend, StepLayout
from prelude.executor.model_executor import ModelExecutor
from prelude.model.config import ModelConfig


class _NoAttention(AttentionBackend):
    def plan(self, layout: StepLayout) -> None:
        pass

    def __call__(self, layer, q, k, v):  # never called: the null model has no layers
        raise AssertionError("null executor ran attention")


class _BlockSizeOnly:
    def __init__(self, block_size: int):
        self.block_size = block_size


class NullModel(nn.Module):
    """Zero hidden states; logits peak on one ordinary (non-eos) token so greedy generation runs
    to max_tokens."""

    def __init__(self, config: ModelConfig, avoid: frozenset[int]):
        super().__init__()
        self.config = config
        self.hidden_size = 8
        gen = torch.Generator().manual_seed(0)
        self.logits_row = torch.randn(config.vocab_size, generator=gen)
        peak = next(t for t in range(10, config.vocab_size) if t not in avoid)
        self.logits_row[peak] = 20.0

    def forward(self, input_ids, positions, attention):
        return torch.zeros(input_ids.shape[0], self.hidden_size)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.logits_row.expand(hidden.shape[0], -1).clone()

    def compute_scores(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.zeros(*hidden.shape[:-1], max(self.config.num_labels, 1))


class NullExecutor(ModelExecutor):
    def __init__(self, config: ModelConfig, block_size: int, avoid_tokens: frozenset[int]):
        # Its tensors are tiny: a second intra-op thread only fights the event loop for a core.
        torch.set_num_threads(1)
        attention = _NoAttention(_BlockSizeOnly(block_size))
        super().__init__(NullModel(config, avoid_tokens), attention, torch.device("cpu"))
