"""Attention backends behind one contract (torch reference, flashinfer), picked by name.

Backends are imported lazily: `torch` runs anywhere; `flashinfer` needs CUDA and the
flashinfer package, and is only imported when asked for.
"""
from __future__ import annotations

import importlib.util
import logging
from typing import Any, Callable

from prelude.model.attention import AttentionBackend, StepLayout
from prelude.executor.kv_cache import KVCache

__all__ = ["AttentionBackend", "BACKENDS", "StepLayout", "get_backend", "pick_backend"]

logger = logging.getLogger(__name__)


def _torch(kv_cache: KVCache, **_: Any) -> AttentionBackend:
    from prelude.executor.attention.torch_ref import TorchAttention

    return TorchAttention(kv_cache)


def _flashinfer(kv_cache: KVCache, **options: Any) -> AttentionBackend:
    from prelude.executor.attention.flashinfer_backend import FlashInferAttention

    return FlashInferAttention(kv_cache, **options)


BACKENDS: dict[str, Callable[..., AttentionBackend]] = {"torch": _torch, "flashinfer": _flashinfer}
# Head sizes flashinfer's prebuilt attention variants are instantiated for.
FLASHINFER_HEAD_DIMS = (64, 128, 256)


def get_backend(name: str, kv_cache: KVCache, **options: Any) -> AttentionBackend:
    """`options` are the backend's constructor arguments (flashinfer: num_q_heads,
    max_pages_per_row, dummy_page, fuse_rope); the torch backend ignores them."""
    if name not in BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; choose one of {sorted(BACKENDS)}")
    return BACKENDS[name](kv_cache, **options)


def pick_backend(kv_cache: KVCache, **options: Any) -> AttentionBackend:
    """flashinfer on CUDA when it is installed, else the torch reference (saying why)."""
    if kv_cache.k.device.type != "cuda":
        return get_backend("torch", kv_cache)
    if kv_cache.shape.head_dim not in FLASHINFER_HEAD_DIMS:
        logger.warning("head_dim %d is not one of flashinfer's %s: CUDA attention uses the torch reference",
                       kv_cache.shape.head_dim, FLASHINFER_HEAD_DIMS)
        return get_backend("torch", kv_cache)
    if importlib.util.find_spec("flashinfer") is None:
        logger.warning("flashinfer is not installed: CUDA attention falls back to the torch reference")
        return get_backend("torch", kv_cache)
    try:
        return get_backend("flashinfer", kv_cache, **options)
    except Exception:  # a broken install must not stop the server: the reference still works
        logger.exception("flashinfer failed to initialize: CUDA attention falls back to the torch reference")
        return get_backend("torch", kv_cache)
