"""Quantized checkpoints: which ones Prelude reads, and reading them.

It reads compressed-tensors' `int-quantized` 8-bit weights: symmetric, one scale per output
channel, what llm-compressor writes for W8A8 and W8A16 checkpoints (`weight` int8 [out, in] beside
`weight_scale` [out, 1]; `input_scale` of static activation schemes is not needed: Prelude
quantizes activations per token, dynamically). Each such weight is widened to the model's dtype
as it loads; on the CPU the loader then stores it in int8 again (cpu_linear), which gives back
the checkpoint's own codes wherever a row's largest code is 127 (a min-max scale, as
llm-compressor's observer sets it). Whether a checkpoint is one is config.int8_weights's call
(ModelConfig.int8_weights); it refuses any other quantization_config with its reason: reading
its tensors as plain weights would serve noise.
"""
from __future__ import annotations

from typing import Iterable, Iterator

import torch

from prelude.model.config import UnsupportedModel

_PAIRED = ".weight_scale"
_UNUSED = (".input_scale", ".weight_zero_point", ".input_zero_point")


def dequantized_tensors(weights: Iterable[tuple[str, torch.Tensor]],
                        dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint's tensors with each int8 weight times its scale, in `dtype`; the scales
    and the unused activation parameters are consumed."""
    pending: dict[str, torch.Tensor] = {}  # a weight's name -> its int8 codes or its scale, whichever came first
    for name, tensor in weights:
        if name.endswith(_UNUSED):
            continue
        if name.endswith(_PAIRED) or tensor.dtype == torch.int8:
            weight_name = name.removesuffix("_scale")
            other = pending.pop(weight_name, None)
            if other is None:
                pending[weight_name] = tensor
                continue
            codes, scale = (tensor, other) if tensor.dtype == torch.int8 else (other, tensor)
            yield weight_name, (codes.to(torch.float32) * scale.to(torch.float32).reshape(-1, 1)).to(dtype)
            continue
        yield name, tensor
    if pending:
        raise UnsupportedModel(f"int8 weights without their scales (or scales without weights): {sorted(pending)[:4]}")
