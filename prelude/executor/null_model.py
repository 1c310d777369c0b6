"""A model that does no work: fixed logits of the right shape, run through the real runner,
flattening, output heads and sampling. With the three executors over it (`null_runner`),
benchmarks measure everything around the model (HTTP, admission, tokenization, scheduling,
responses)."""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from prelude.executor.runner import ModelRunner
from prelude.model.attention import AttentionBackend, QKNorm, StepLayout
from prelude.model.config import ModelConfig
from prelude.contract.stop import StopFlag
from prelude.model.decoder import ResumableForward


class _NoAttention(AttentionBackend):
    def plan(self, layout: StepLayout) -> None:
        pass

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 rope: tuple[torch.Tensor, torch.Tensor] | None = None,
                 qk_norm: QKNorm | None = None) -> torch.Tensor:
        raise AssertionError("the null model has no layers to run attention in")


class _Done:
    """A forward with nothing left to run."""

    def __init__(self, hidden: torch.Tensor):
        self.hidden = hidden

    def advance(self, attention: AttentionBackend, stop: StopFlag) -> torch.Tensor | None:
        return self.hidden


class NullModel(nn.Module):
    """Zero hidden states; logits peak on one ordinary (non-eos) token so greedy generation runs
    to max_tokens."""

    skips_unread_tokens = True
    classifier_pooling = "last"

    def __init__(self, config: ModelConfig, avoid: frozenset[int]):
        super().__init__()
        self.config = config
        self.hidden_size = 8
        gen = torch.Generator().manual_seed(0)
        self.logits_row = torch.randn(config.vocab_size, generator=gen)
        peak = next(t for t in range(10, config.vocab_size) if t not in avoid)
        self.logits_row[peak] = 20.0

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attention: AttentionBackend,
                keep: torch.Tensor | None = None, on_launch: Callable[[], None] | None = None) -> torch.Tensor:
        if on_launch is not None:
            on_launch()
        return torch.zeros(input_ids.shape[0] if keep is None else len(keep), self.hidden_size)

    def begin(self, input_ids: torch.Tensor, positions: torch.Tensor, attention: AttentionBackend,
              keep: torch.Tensor | None, stop: StopFlag) -> ResumableForward:
        return _Done(self.forward(input_ids, positions, attention, keep))

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.logits_row.expand(hidden.shape[0], -1).clone()

    def compute_label_logits(self, hidden: torch.Tensor, token_ids: tuple[int, ...]) -> torch.Tensor:
        return self.logits_row[list(token_ids)].expand(hidden.shape[0], -1).clone()

    def compute_scores(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.zeros(*hidden.shape[:-1], max(self.config.num_labels, 1))


def null_runner(config: ModelConfig, block_size: int, avoid_tokens: frozenset[int]) -> ModelRunner:
    # Its tensors are tiny: a second intra-op thread only fights the event loop for a core.
    torch.set_num_threads(1)
    return ModelRunner(NullModel(config, avoid_tokens), _NoAttention(), torch.device("cpu"), block_size)
