"""What the model runner and the output heads call on a model: DecoderLM, or the null model the
benchmarks run. A Protocol rather than DecoderLM itself, so that mypy checks every model handed
to the runner: the null model once fell behind the runner (a missing method, no `keep`) and
`--executor null` died at startup with nothing to catch it before a benchmark did."""
from __future__ import annotations

from typing import Any, Callable, Protocol

import torch

from prelude.model.attention import AttentionBackend
from prelude.model.config import ModelConfig
from prelude.contract.stop import StopFlag
from prelude.model.decoder import ResumableForward


class ModelHeads(Protocol):
    """What the output heads (executor.heads) call on a model: its heads over final states."""

    # Which states compute_scores reads: a row's last token, its first (cls) or their mean.
    classifier_pooling: str
    config: ModelConfig  # its vocab_size: the width of compute_logits' rows

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor: ...

    def compute_label_logits(self, hidden: torch.Tensor, token_ids: tuple[int, ...]) -> torch.Tensor: ...

    def compute_scores(self, hidden: torch.Tensor) -> torch.Tensor: ...


class RunnableModel(ModelHeads, Protocol):
    # nn.Module's own __call__ (hooks, then forward); forward is the signature it keeps.
    __call__: Callable[..., Any]
    # Whether forward's `keep` spares the tokens the heads do not read (a decoder's last layer).
    skips_unread_tokens: bool

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attention: AttentionBackend,
                keep: torch.Tensor | None = None, on_launch: Callable[[], None] | None = None) -> torch.Tensor: ...

    def begin(self, input_ids: torch.Tensor, positions: torch.Tensor, attention: AttentionBackend,
              keep: torch.Tensor | None, stop: StopFlag) -> ResumableForward: ...
