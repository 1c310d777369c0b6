"""Attention backends: the contract, and the per-step metadata every backend plans from."""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Sequence

import torch

from prelude.executor.kv_cache import KVCache


@dataclass(frozen=True, slots=True)
class StepLayout:
    """Where each row of a flattened step sits. Rows are ordered prefill rows first, then
    decode rows; row i owns tokens [query_starts[i], query_starts[i+1]) of the step and
    attends to `context_lens[i]` cached tokens before them plus its own tokens causally."""

    query_starts: Sequence[int]  # len(rows) + 1
    context_lens: Sequence[int]
    block_tables: Sequence[Sequence[int]]
    store_kv: Sequence[bool]
    num_prefill_rows: int
    slot_mapping: torch.Tensor  # [num_tokens] flat KV slot per token, -1 where not stored
    # The same slots as a host list, when the executor has it: backends that plan on the host
    # read it instead of copying slot_mapping back from the device.
    host_slots: Sequence[int] | None = None

    @property
    def num_rows(self) -> int:
        return len(self.context_lens)

    def query_len(self, row: int) -> int:
        return self.query_starts[row + 1] - self.query_starts[row]


class AttentionBackend(ABC):
    """Computes attention for all rows of one step, layer by layer.

    `plan` runs once per step, before the first layer (precompute indices, flashinfer plan);
    `__call__` runs once per layer: it first stores this step's K/V into the paged cache for rows
    with store_kv, then returns causal attention of the step's queries over each row's cached
    context plus its own new tokens.

    A backend with `fuses_rope` receives q/k before rotary embedding (and before the per-head
    q/k norms, whose weights come in `qk_norm`) and applies them itself, fused with its KV
    write; the model then skips its own rotation."""

    fuses_rope: bool = False

    def __init__(self, kv_cache: KVCache):
        self.kv_cache = kv_cache

    @abstractmethod
    def plan(self, layout: StepLayout) -> None: ...

    @abstractmethod
    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor: ...
