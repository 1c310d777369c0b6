"""A row's cached context laid out as a prefix-cache hit finds it: in KV blocks neither contiguous
nor in order in the cache, among blocks of other rows (random data), the last one partial. The
prefill-attention benchmark times the kernel on it; the attention tests check it there."""
from __future__ import annotations

import torch

from kernels.cpu.ops import CachedContext


def scattered_table(tokens: int, block_size: int, gen: torch.Generator, spare: int = 3) -> torch.Tensor:
    """Block ids for `tokens` tokens, drawn in shuffled order from a cache `spare` blocks larger."""
    blocks = -(-tokens // block_size)
    return torch.randperm(blocks + spare, generator=gen)[:blocks]


def scatter(k_cache: torch.Tensor, table: torch.Tensor, x: torch.Tensor) -> None:
    """Writes x ([tokens, ...]) into the blocks `table` lists, in order."""
    block_size, tokens = k_cache.shape[1], len(x)
    slots = table.repeat_interleave(block_size)[:tokens] * block_size + torch.arange(tokens) % block_size
    k_cache.flatten(0, 1)[slots] = x


def scattered_context(k: torch.Tensor, v: torch.Tensor, block_size: int, gen: torch.Generator) -> CachedContext:
    """k, v ([tokens, kv_heads, dim]) as a context in scattered blocks of a random cache."""
    table = scattered_table(len(k), block_size, gen)
    caches = [torch.randn(len(table) + 3, block_size, *k.shape[1:], generator=gen) for _ in range(2)]
    scatter(caches[0], table, k)
    scatter(caches[1], table, v)
    return CachedContext(caches[0], caches[1], table, len(k))
