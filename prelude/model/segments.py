"""A layer of a long input run in short segments, for cooperative preemption (FlowPrefill).

Stopping only between layers left a short request waiting for a whole layer: at 8K tokens on
the demo model that is ~0.4 s, most of it attention. A segment is one of: the q/k/v projection
of a chunk of tokens (the first also runs the input norm); the attention of one KV head and the
query heads it serves for a chunk of queries (when the backend can attend head ranges); the
output projection and post-attention norm of a chunk of tokens; the MLP of a chunk of tokens.
Chunks are sized by their work (segment_tokens, query_chunks), not by a count. The backend
merges a query chunk's causal part and its earlier keys by their log-sum-exps, and projections
and norms act on each token alone, so a segmented forward equals an uninterrupted one within
float32 rounding. Its longest segment on the demo model at 8K tokens went from ~40 ms (the last
query chunk with the whole output projection; the whole q/k/v projection took ~20 ms) to ~15 with
1,024-token segments; SEGMENT_TOKENS has what 512 gained beside that."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from prelude.model.attention import AttentionBackend
from prelude.model.layers import MLP_CHUNK_TOKENS

# A segment's work, sized on the demo model where a short request's wait was measured: at most
# SEGMENT_TOKENS tokens, and for wider models as many as make SEGMENT_MLP_MACS of MLP (Qwen3-0.6B:
# the floor, 64 tokens, not 512 of 16x the work). Beside 8K-token embeddings on the demo model a
# short request's P99 fell from 82-87 ms at 2,048 tokens to 56-58 ms at 1,024 (bench.serving.
# long_short, fcfs). At 512 (2026-11-28, `--long-share 0.85 --deadline-ms 20`, five runs
# alternating with 1,024): short P50 10.7-11.8 ms against 12.0-12.6, SLO attainment 94.7-98.7%
# against 91.8-94.8%, for 9-14% more time on an 8K-token step run alone. Most of that cost and of
# the gain is the attention's: MLP and projections at 512 with attention chunks as at 1,024 cost
# 0-4% more and gained nothing.
SEGMENT_TOKENS = 512
SEGMENT_MLP_MACS = 3 * 256 * 768 * SEGMENT_TOKENS
MIN_SEGMENT_TOKENS = 64  # below, the matmuls lose more than a shorter wait gains
# An attention segment's work, in (query, key) pairs times head_dim: a chunk of queries late in a
# long input sees many more keys than an early one, so chunks are sized by pairs, not queries.
# Two SEGMENT_TOKENS-square blocks at the demo's head_dim (32); at 1,024 that was about an MLP
# segment's time (~7 ms), and fixed 1,024-query chunks made the last ones of an 8K input take 4x
# that (27 ms). The pairs shrink with the square of SEGMENT_TOKENS, the MLP's tokens linearly.
SEGMENT_PAIR_DIMS = 2 * SEGMENT_TOKENS * SEGMENT_TOKENS * 32

if TYPE_CHECKING:  # the decoder imports this module
    from prelude.model.decoder import DecoderLayer, LayerState


def segment_tokens(hidden: int, intermediate: int) -> int:
    """Tokens per projection and MLP segment of a layer of these sizes."""
    return max(MIN_SEGMENT_TOKENS, min(SEGMENT_TOKENS, SEGMENT_MLP_MACS // (3 * hidden * intermediate)))


def query_chunks(context: int, tokens: int, head_dim: int) -> list[tuple[int, int]]:
    """A row's queries [start, end) in attention segments of about SEGMENT_PAIR_DIMS / head_dim
    causal (query, key) pairs each (at most SEGMENT_TOKENS queries): over `context` cached keys,
    query i sees context + i + 1 keys."""
    pairs = SEGMENT_PAIR_DIMS // head_dim
    chunks, start = [], 0
    while start < tokens:
        # the largest end with (end - start) * (context + end) <= pairs
        span = context - start
        end = int((-span + math.sqrt(span * span + 4 * (start * context + pairs))) / 2)
        end = min(tokens, start + SEGMENT_TOKENS, max(end, start + 1))
        chunks.append((start, end))
        start = end
    return chunks


@dataclass(slots=True)
class LayerProgress:
    """How far a layer got: the input norm, then its q/k/v projected so far (tokens), attended so
    far (heads by KV head), through the output projection and post-attention norm so far
    (tokens), then the MLP's output so far (tokens)."""

    normed: torch.Tensor | None = None
    qkv: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
    projected: int = 0
    attended: torch.Tensor | None = None
    kv_heads_done: int = 0
    chunks_done: int = 0  # of the current KV head's query chunks
    residual_out: torch.Tensor | None = None  # the residual stream after the attention
    mlp_input: torch.Tensor | None = None
    out_done: int = 0  # tokens of mlp_input written (output projection and norm)
    mlp_output: torch.Tensor | None = None
    tokens_done: int = 0  # tokens of mlp_output written


def worth_segmenting(x: torch.Tensor) -> bool:
    """Only a CPU forward of more than one MLP chunk runs in segments. Up to one MLP chunk a
    layer runs whole: such steps are batches of short rows (c=16 of 128 tokens), where nothing
    is short enough beside them to step aside for, and finer pieces would only cost time. On a
    GPU a whole layer is short enough to wait for (8K tokens of Qwen3-4B: ~3 ms on an H200), so
    the step stops between layers only and launches nothing extra."""
    return x.device.type == "cpu" and x.shape[0] > MLP_CHUNK_TOKENS


def run_segment(layer: DecoderLayer, state: LayerState, attention: AttentionBackend,
                keep: torch.Tensor | None = None) -> None:
    """Runs the next segment of layer `state.next_layer`, moving on to the next layer after its
    last one. With `keep`, the layer's output projection, norm and MLP run for those tokens only."""
    progress = state.progress
    if progress.mlp_input is None and progress.qkv is None:
        if attention.supports_head_ranges and not attention.fuses_rope:
            _begin_projection(layer, state, progress)
        else:  # the backend attends all heads in one call: the attention is one segment
            progress.mlp_input, state.residual = layer.attend(state.x, state.residual, state.rope, attention, keep)
            progress.mlp_output = torch.empty_like(progress.mlp_input)
    elif progress.normed is not None:  # tokens left to project
        _project_chunk(layer, state, progress)
    elif progress.qkv is not None:
        _attend_kv_head(layer, state, progress, attention, keep)
    elif progress.attended is not None:  # tokens left through the output projection
        _output_chunk(layer, state, progress)
    else:
        _mlp_chunk(layer, state, progress)


def _begin_projection(layer: DecoderLayer, state: LayerState, progress: LayerProgress) -> None:
    """The input norm (cheap: one pass over the tokens), and the first chunk's q/k/v."""
    if state.residual is None:
        state.residual, progress.normed = state.x, layer.input_layernorm(state.x)
    else:
        progress.normed, state.residual = layer.input_layernorm(state.x, state.residual)
    attn = layer.self_attn
    tokens, dtype, device = len(state.x), state.x.dtype, state.x.device
    progress.qkv = (torch.empty(tokens, attn.num_heads, attn.head_dim, dtype=dtype, device=device),
                    torch.empty(tokens, attn.num_kv_heads, attn.head_dim, dtype=dtype, device=device),
                    torch.empty(tokens, attn.num_kv_heads, attn.head_dim, dtype=dtype, device=device))
    progress.attended = torch.empty_like(progress.qkv[0])
    _project_chunk(layer, state, progress)


def _project_chunk(layer: DecoderLayer, state: LayerState, progress: LayerProgress) -> None:
    assert progress.normed is not None and progress.qkv is not None
    start, end = progress.projected, progress.projected + _tokens(layer)
    cos, sin = state.rope
    for whole, part in zip(progress.qkv, layer.self_attn.project(progress.normed[start:end],
                                                                 (cos[start:end], sin[start:end]))):
        whole[start:end] = part
    progress.projected = min(end, len(progress.normed))
    if progress.projected == len(progress.normed):
        progress.normed = None


def _attend_kv_head(layer: DecoderLayer, state: LayerState, progress: LayerProgress,
                    attention: AttentionBackend, keep: torch.Tensor | None) -> None:
    """One chunk of queries of the current KV head (and the query heads it serves)."""
    assert progress.qkv is not None and progress.attended is not None
    q, k, v = progress.qkv
    group = q.shape[1] // k.shape[1]
    h = progress.kv_heads_done
    heads = slice(h * group, (h + 1) * group)
    start, end, out = attention.attend_heads(layer.self_attn.layer, q[:, heads], k[:, h:h + 1], v[:, h:h + 1],
                                             (h, h + 1), progress.chunks_done)
    progress.attended[start:end, heads] = out
    progress.chunks_done += 1
    if progress.chunks_done < attention.head_chunks():
        return
    progress.kv_heads_done, progress.chunks_done = h + 1, 0
    if progress.kv_heads_done == k.shape[1]:
        attended, residual = progress.attended.reshape(q.shape[0], -1), state.residual
        assert residual is not None, "the input norm set the residual"
        if keep is not None:
            attended, residual = attended[keep], residual[keep]
        progress.attended, state.residual = attended, residual
        progress.mlp_input = torch.empty_like(residual)
        progress.residual_out = torch.empty_like(residual)
        progress.mlp_output = torch.empty_like(residual)
        progress.qkv = None


def _output_chunk(layer: DecoderLayer, state: LayerState, progress: LayerProgress) -> None:
    """The output projection and the post-attention norm of a chunk of tokens. The residual
    stream's new value goes to its own tensor: later chunks still read the old one."""
    assert progress.attended is not None and progress.mlp_input is not None and progress.residual_out is not None
    assert state.residual is not None
    start, end = progress.out_done, progress.out_done + _tokens(layer)
    out = layer.self_attn.o_proj(progress.attended[start:end])
    progress.mlp_input[start:end], progress.residual_out[start:end] = layer.post_attention_layernorm(
        out, state.residual[start:end])
    progress.out_done = min(end, len(progress.mlp_input))
    if progress.out_done == len(progress.mlp_input):
        state.residual, progress.residual_out, progress.attended = progress.residual_out, None, None


def _mlp_chunk(layer: DecoderLayer, state: LayerState, progress: LayerProgress) -> None:
    assert progress.mlp_input is not None and progress.mlp_output is not None
    start, end = progress.tokens_done, progress.tokens_done + _tokens(layer)
    progress.mlp_output[start:end] = layer.mlp(progress.mlp_input[start:end])
    progress.tokens_done = min(end, progress.mlp_input.shape[0])
    if progress.tokens_done == progress.mlp_input.shape[0]:
        state.x = progress.mlp_output
        state.progress = LayerProgress()
        state.next_layer += 1


def _tokens(layer: DecoderLayer) -> int:
    intermediate2, hidden = layer.mlp.gate_up_proj.weight.shape
    return segment_tokens(hidden, intermediate2 // 2)
