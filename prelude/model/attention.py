"""The attention-backend contract: what the model calls once per layer, and what an executor
plans once per step. Defined here, beside the model that calls it; the torch reference and the
flashinfer backend (prelude.executor.attention) implement it."""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Literal, Sequence

import torch

from prelude.contract.record import record

# (q_norm weight, k_norm weight, eps) handed to backends that fuse the per-head norms.
QKNorm = tuple[torch.Tensor, torch.Tensor, float]
# The step shapes a backend can replay from a CUDA graph: a pure decode step, or one fresh
# prefill row, padded to a bucket.
GraphKind = Literal["decode", "prefill"]


@record
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
    # The same slots in host memory (a list, or an int64 CPU tensor), when the executor has
    # them: backends that plan on the host read them instead of copying slot_mapping back.
    host_slots: Sequence[int] | torch.Tensor | None = None
    # Per row: lengths of the independent items that end it (see PrefillRow.item_lengths);
    # empty for an ordinary causal row. None when no row of the step has items.
    item_lengths: Sequence[tuple[int, ...]] | None = None

    @property
    def num_rows(self) -> int:
        return len(self.context_lens)

    def query_len(self, row: int) -> int:
        return self.query_starts[row + 1] - self.query_starts[row]


@record
class PagedStepInputs:
    """A planned step as a model that runs all its layers natively reads it
    (prelude.executor.fused_step): the whole paged cache, each row's place in the step and its
    blocks, each token's cache slot. Rows before `decode_from` are prompt rows, attended from
    the keys they compute over their cached context; the rest are decode rows (one stored token
    each), attended from the cache. int64, on the CPU."""

    k_cache: torch.Tensor  # [layers, blocks, block_size, kv_heads, head_dim]
    v_cache: torch.Tensor
    query_starts: torch.Tensor  # [rows + 1]
    context_lens: torch.Tensor  # [rows]: tokens cached before the row's new ones
    block_tables: torch.Tensor  # [rows, width]: the blocks of the context and of the stored new tokens
    slots: torch.Tensor  # [tokens]: where each new token's K/V goes, -1 where it is not stored
    decode_from: int
    # Multi-item rows: row i's items' lengths are item_lengths[item_starts[i]:item_starts[i + 1]]
    # (None: no row has items).
    item_starts: torch.Tensor | None = None
    item_lengths: torch.Tensor | None = None


def own_token_mask(n: int, items: Sequence[int], device: torch.device) -> torch.Tensor:
    """[n, n] boolean: which of a prefill row's own n tokens each of them attends to (True: it
    does). Without items, causal. With items (the row ends with them, StepLayout.item_lengths),
    a token of the shared part sees the shared part causally, and a token of an item sees the
    whole shared part and its own item causally, never another item. Cached context, which
    every token sees, is not part of it."""
    index = torch.arange(n, device=device)
    causal = index[None, :] <= index[:, None]
    if not items:
        return causal
    # Each token's segment: 0 for the shared part, k for the k-th item.
    counts = torch.tensor([n - sum(items), *items], device=device)
    segment = torch.repeat_interleave(torch.arange(len(items) + 1, device=device), counts, output_size=n)
    return causal & ((segment[None, :] == 0) | (segment[None, :] == segment[:, None]))


class AttentionBackend(ABC):
    """Computes attention for all rows of one step, layer by layer.

    `plan` runs once per step, before the first layer (precompute indices, flashinfer plan).
    Calling the backend runs once per layer: it first stores this step's K/V into the paged
    cache for rows with store_kv, then returns causal attention of the step's queries over each
    row's cached context plus its own new tokens. q: [T, num_heads, head_dim]; k, v:
    [T, num_kv_heads, head_dim]; the result is [T, num_heads, head_dim].

    `fuses_rope`: the backend receives q/k before rotary embedding (and before the per-head q/k
    norms, whose weights come in `qk_norm`) and applies them itself, fused with its KV write;
    the model then skips its own rotation and passes the step's (cos, sin) as `rope`.

    `graph_kinds`: the step shapes the backend can plan for CUDA-graph replay with
    `plan_graph` (none by default). `supports_items`: the backend masks multi-item rows."""

    fuses_rope: bool = False
    graph_kinds: frozenset[GraphKind] = frozenset()
    supports_items: bool = False  # can mask multi-item rows (StepLayout.item_lengths)

    @abstractmethod
    def plan(self, layout: StepLayout) -> None: ...

    @abstractmethod
    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 rope: tuple[torch.Tensor, torch.Tensor] | None = None,
                 qk_norm: QKNorm | None = None) -> torch.Tensor: ...

    def store(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              rope: tuple[torch.Tensor, torch.Tensor], qk_norm: QKNorm | None,
              slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The first half of a call on a backend that fuses RoPE: q and k normed and rotated,
        k and v written to the cache at `slots` (-1: not stored), whatever the plan; returns
        (q, k) as `attend` takes them. Sync-free and shape-static, so a CUDA graph can hold it
        (see prelude.executor.piecewise_graphs)."""
        raise NotImplementedError(f"{type(self).__name__} does not split its calls")

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """The second half: the planned step's attention, its K/V already stored by `store`."""
        raise NotImplementedError(f"{type(self).__name__} does not split its calls")

    def bidirectional(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int = 0) -> torch.Tensor:
        """An encoder's attention: each row's queries over all of its own tokens (no cache, no
        causal mask), or, with `window`, over the tokens at most that far from each query."""
        raise NotImplementedError(f"{type(self).__name__} does not run encoders")

    def paged_step_inputs(self) -> PagedStepInputs | None:
        """The planned step's paged layout when the backend keeps its cache where a native step
        can read it and the step is one such a step computes; None otherwise (the default)."""
        return None

    def plan_graph(self, kind: GraphKind, layout: StepLayout, bucket: int) -> None:
        """Plans a step padded to `bucket` (rows for decode, tokens for prefill) on that
        bucket's graph-safe buffers; layout.slot_mapping is the graph's static slot buffer."""
        raise NotImplementedError(f"{type(self).__name__} cannot replay {kind} steps from CUDA graphs")
