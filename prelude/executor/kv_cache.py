"""Paged KV cache storage: per layer, K and V as [num_blocks, block_size, num_kv_heads, head_dim]
(flashinfer's NHD paged layout). Which block belongs to whom is the cache package's business;
this is only the memory."""
from __future__ import annotations

from dataclasses import dataclass

import math

import torch

from prelude.host_tuning import zeroed_pages
from prelude.model.config import ModelConfig



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
        return config.kv_bytes_per_block(block_size, torch.empty((), dtype=dtype).element_size())

    @classmethod
    def for_model(cls, config: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype):
        return cls(config.num_layers, num_blocks, block_size, config.num_kv_heads, config.head_dim, dtype)


class KVCache:
    def __init__(self, shape: KVCacheShape, device: torch.device):
        self.shape = shape
        dims = (shape.num_layers, shape.num_blocks, shape.block_size, shape.num_kv_heads, shape.head_dim)
        # Never-written slots are read (masked out) by padded attention, and garbage there could be
        # NaN, which survives masking (0 * NaN). So the cache starts zeroed.
        self.k = _zeros(dims, shape.dtype, device)
        self.v = _zeros(dims, shape.dtype, device)

    @property
    def block_size(self) -> int:
        return self.shape.block_size

    def layer(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k[layer], self.v[layer]


def _zeros(dims: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Zeros without a startup memset on the CPU (host_tuning.zeroed_pages); on CUDA the memset
    is cheap."""
    if device.type != "cpu":
        return torch.zeros(dims, dtype=dtype, device=device)
    itemsize = torch.empty((), dtype=dtype).element_size()
    return torch.frombuffer(zeroed_pages(math.prod(dims) * itemsize), dtype=dtype, count=math.prod(dims)).view(dims)
