"""Loads an HF-format checkpoint directory into a DecoderLM on the target device and dtype.

Tensors are read through safetensors' memory map straight into the already-allocated target
parameters (converted on copy), so no full-precision copy of the model is ever made.
"""
from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import torch
from safetensors import safe_open

from prelude.model.config import ModelConfig, UnsupportedModel
from prelude.model.bert import BertLM
from prelude.model.decoder import DecoderLM
from prelude.model.encoder import EncoderLM
from prelude.model.modernbert import ModernBertLM
from prelude.model.ops import TORCH_OPS, Ops

logger = logging.getLogger(__name__)

ENCODERS: dict[str, type[EncoderLM]] = {"bert": BertLM, "xlm-roberta": BertLM, "modernbert": ModernBertLM}
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """`auto` is bfloat16 on CUDA and float32 on CPU (where bf16 matmuls are slow)."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if name not in DTYPES:
        raise ValueError(f"--dtype must be auto or one of {sorted(DTYPES)}, got {name!r}")
    return DTYPES[name]


def checkpoint_files(model_dir: Path) -> list[Path]:
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [model_dir / shard for shard in shards]
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise UnsupportedModel(f"no *.safetensors weights in {model_dir}; save the checkpoint as safetensors "
                              "(save_pretrained(..., safe_serialization=True))")
    return files


def build_model(config: ModelConfig, dtype: torch.dtype, device: torch.device, max_positions: int,
                ops: Ops = TORCH_OPS) -> DecoderLM | EncoderLM:
    """An uninitialized model on `device`: parameters are allocated in the target dtype and never
    initialized (the checkpoint fills them), so nothing is computed or copied twice. `ops`
    picks the implementation of norms and activations (prelude.model.ops)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            if config.encoder is not None:
                encoder = ENCODERS[config.encoder.kind](config, max_positions)
                return encoder.eval().requires_grad_(False)
            model = DecoderLM(config, max_positions)
    finally:
        torch.set_default_dtype(previous)
    model.rotary.materialize(device)
    model.set_ops(ops)
    return model.eval().requires_grad_(False)


def load_model(model_dir: str | Path, config: ModelConfig, dtype: torch.dtype, device: torch.device,
               max_positions: int, ops: Ops = TORCH_OPS) -> DecoderLM | EncoderLM:
    model_dir = Path(model_dir)
    start = time.perf_counter()
    model = build_model(config, dtype, device, max_positions, ops)
    loaded: set[str] = set()
    # safetensors' "cuda" device reads each tensor straight into device memory.
    read_device = str(device) if device.type == "cuda" else "cpu"
    with torch.no_grad():
        for path in checkpoint_files(model_dir):
            with safe_open(str(path), framework="pt", device=read_device) as f:
                loaded |= model.load_weights((name, f.get_tensor(name)) for name in f.keys())
    missing = model.expected_weights() - loaded
    if missing:
        raise UnsupportedModel(f"checkpoint {model_dir} lacks weights: {sorted(missing)[:8]}")
    logger.info("loaded %s (%s, %s) in %.2fs", model_dir, config.architecture, dtype,
                time.perf_counter() - start)
    return model
