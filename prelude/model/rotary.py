"""The rotary embedding's table: each position's cos and sin per frequency (neox style, rotate
halves), built once with the model, in numpy so the model without torch (model.native_decoder)
and the torch one (model.layers.RotaryEmbedding) read the same table."""
from __future__ import annotations

import numpy as np

from prelude.model.config import RopeConfig


def rotary_table(rope: RopeConfig, head_dim: int, max_positions: int) -> np.ndarray:
    """[max_positions, head_dim] fp32: each position's cos, then its sin."""
    inv_freq = inverse_frequencies(rope, head_dim).astype(np.float32)
    freqs = np.outer(np.arange(max_positions, dtype=np.float32), inv_freq)
    return np.ascontiguousarray(np.concatenate([np.cos(freqs), np.sin(freqs)], axis=-1), np.float32)


def inverse_frequencies(rope: RopeConfig, head_dim: int) -> np.ndarray:
    """The rotary inverse frequencies in float64, per rope.kind (default, linear, llama3)."""
    inv_freq = 1.0 / (rope.theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    if rope.kind == "linear":
        return inv_freq / rope.factor
    if rope.kind == "llama3":
        low_wavelen = rope.original_max_position / rope.low_freq_factor
        high_wavelen = rope.original_max_position / rope.high_freq_factor
        wavelen = 2 * np.pi / inv_freq
        scaled = np.where(wavelen > low_wavelen, inv_freq / rope.factor, inv_freq)
        smooth = (rope.original_max_position / wavelen - rope.low_freq_factor) / (
            rope.high_freq_factor - rope.low_freq_factor)
        smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        return np.where(medium, smoothed, scaled)
    return inv_freq
