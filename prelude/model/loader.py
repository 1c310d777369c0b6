"""Loads an HF-format checkpoint directory into a DecoderLM on the target device and dtype.

Tensors are read through safetensors' memory map straight into the already-allocated target
parameters (converted on copy), so no full-precision copy of the model is ever made; on the CPU
those already in the parameter's dtype are taken from the map as they are (where no fusing needs
a copy: layers.fill; a bf16 checkpoint's projections and embeddings are read as bf16), stored for
the kernels from there, and whatever the kernels did not take is then copied out of the map.
"""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Iterator

import torch
from safetensors import safe_open

from prelude.model.config import ModelConfig, UnsupportedModel
from prelude.model.bert import BertLM
from prelude.model.decoder import DecoderLM
from prelude.model.encoder import EncoderLM
from prelude.model.layers import stored_formats
from prelude.model.modernbert import ModernBertLM
from prelude.model.checkpoint_arrays import checkpoint_files
from prelude.model.weight_formats import stored_format
from prelude.model.ops import TORCH_OPS, Ops
from prelude.model.quantized_checkpoint import dequantized_tensors

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


def cpu_weight_format(dtype: torch.dtype, quantization: str, config: ModelConfig) -> tuple[torch.dtype, str | None]:
    """(the dtype a model computes in on the CPU, the format its stored weights take, None: not
    stored): native_decoder.stored_format's, an encoder refused int8. An fp32 weight that bf16
    holds exactly (a bf16 checkpoint's) is kept as bf16x2 on any CPU (layers._stored)."""
    if (quantization == "int8" or config.int8_weights) and config.encoder is not None:
        raise UnsupportedModel("--quantization int8 serves decoder models; "
                               f"{config.architecture} is an encoder")
    format = stored_format(str(dtype).removeprefix("torch."), quantization, config)
    return (dtype if format is None else torch.float32), format


def _floats_all_bf16(files: list[Path]) -> bool:
    """Whether every floating tensor of the checkpoint is bf16 (from the files' headers; integer
    buffers such as an encoder's position ids aside)."""
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            dtypes = {f.get_slice(name).get_dtype() for name in f.keys()}
        if "BF16" not in dtypes or any(d.startswith("F") for d in dtypes):
            return False
    return True


def _matrices_as(model: torch.nn.Module, dtype: torch.dtype, keep_values: bool) -> None:
    """Every 2-D parameter of the model (its projections and embeddings) made `dtype`: converted,
    or with `keep_values` False left empty for the checkpoint to fill."""
    for module in model.modules():
        for name, param in list(module.named_parameters(recurse=False)):
            if param.dim() == 2 and param.dtype != dtype:
                data = param.to(dtype) if keep_values else torch.empty(param.shape, dtype=dtype, device=param.device)
                setattr(module, name, torch.nn.Parameter(data, requires_grad=False))


def _tensors(files: list[Path], device: str, maps: set[int]) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint's tensors; `maps` collects the storages they are read into (on the CPU, a
    file's memory map)."""
    for path in files:
        with safe_open(str(path), framework="pt", device=device) as f:
            for name in f.keys():
                tensor = f.get_tensor(name)
                maps.add(tensor.untyped_storage().data_ptr())
                yield name, tensor


def _owned(model: torch.nn.Module, maps: set[int]) -> None:
    """Every parameter still backed by a checkpoint file's map (layers.fill took it, and the
    kernels did not store it) copied into the process's memory: a weight never changes with the
    file under a running server."""
    for param in model.parameters():
        if param.numel() and param.untyped_storage().data_ptr() in maps:
            param.data = param.data.clone()


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
               max_positions: int, ops: Ops = TORCH_OPS,
               weight_format: str | None = "float32") -> DecoderLM | EncoderLM:
    """The checkpoint's model; on the CPU its weights are then stored for the native kernels in
    `weight_format` (cpu_weight_format; None: left as loaded). A bf16 checkpoint's projections and
    embeddings are read as bf16 and stored from there (cpu_linear.SOURCES): never held in fp32
    (twice their bytes) on the way, which cost B 0.2 s of startup; whatever the kernels do not take
    is widened to `dtype` after."""
    model_dir = Path(model_dir)
    start = time.perf_counter()
    model = build_model(config, dtype, device, max_positions, ops)
    files = checkpoint_files(model_dir)
    stored_as = weight_format if device.type == "cpu" else None  # None: the weights stay as read
    read_bf16 = (stored_as is not None and dtype == torch.float32 and not config.int8_weights
                 and _floats_all_bf16(files))
    if read_bf16:
        _matrices_as(model, torch.bfloat16, keep_values=False)
    # safetensors' "cuda" device reads each tensor straight into device memory.
    read_device = str(device) if device.type == "cuda" else "cpu"
    maps: set[int] = set()
    tensors = _tensors(files, read_device, maps)
    with torch.no_grad():
        loaded = model.load_weights(dequantized_tensors(tensors, dtype) if config.int8_weights else tensors)
    missing = model.expected_weights() - loaded
    if missing:
        raise UnsupportedModel(f"checkpoint {model_dir} lacks weights: {sorted(missing)[:8]}")
    loaded_at = time.perf_counter()
    stored = ""
    if stored_as is not None:
        model.store_weights(stored_as)
        if read_bf16:
            _matrices_as(model, dtype, keep_values=True)
    if device.type == "cpu":
        _owned(model, maps)
    if stored_as is not None:
        formats = "/".join(stored_formats(model)) or "as read"
        stored = f", weights stored {formats} in {time.perf_counter() - loaded_at:.2f}s"
    logger.info("loaded %s (%s, %s) in %.2fs%s", model_dir, config.architecture, dtype, loaded_at - start, stored)
    return model
