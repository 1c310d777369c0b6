"""Paged KV cache storage: per layer, K and V as [num_blocks, block_size, num_kv_heads, head_dim]
(flashinfer's NHD paged layout). Which block belongs to whom is the cache package's business;
this is only the memory."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from prelude.model.config import ModelConfig


FRESH_PAGES_BYTES = 32 * 2**20


@dataclass(frozen=True, slots=True)
class KVCacheShape:
    num_layers: int
    num_blocks: int
    block_size: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype

    @staticmethod
    def bytes_per_block(config: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
        itemsize = torch.empty((), dtype=dtype).element_size()
        return 2 * config.num_layers * block_size * config.num_kv_heads * config.head_dim * itemsize

    @classmethod
    def for_model(cls, config: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype):
        return cls(config.num_layers, num_blocks, block_size, config.num_kv_heads, config.head_dim, dtype)


class KVCache:
    def __init__(self, shape: KVCacheShape, device: torch.device):
        self.shape = shape
        dims = (shape.num_layers, shape.num_blocks, shape.block_size, shape.num_kv_heads, shape.head_dim)
        # Never-written slots are only ever read masked out, but a NaN there would still poison
        # the masked sum. glibc serves allocations of 32 MiB and more (its largest mmap
        # threshold) with fresh mmap pages, which are zero, so `empty` gives zeros without
        # touching (and paying for) every page at startup; smaller ones may reuse freed heap
        # memory holding anything, so they are zeroed explicitly (cheaply, being small).
        nbytes = torch.Size(dims).numel() * torch.empty((), dtype=shape.dtype).element_size()
        alloc = torch.empty if device.type == "cpu" and nbytes >= FRESH_PAGES_BYTES else torch.zeros
        self.k = alloc(dims, dtype=shape.dtype, device=device)
        self.v = alloc(dims, dtype=shape.dtype, device=device)

    @property
    def block_size(self) -> int:
        return self.shape.block_size

    def layer(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k[layer], self.v[layer]
