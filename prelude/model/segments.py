"""A layer of a long input run in short segments, for cooperative preemption (FlowPrefill).

Stopping only between layers left a short request waiting for a whole layer: at 8K tokens on
the demo model that is ~0.4 s, most of it attention. A segment is one of: the input norm and
the q/k/v projection; the attention of one KV head and the query heads it serves (when the
backend can attend head ranges); the output projection with the post-attention norm; one
SEGMENT_TOKENS chunk of the MLP. Attention is split by KV head and, within one, by chunks of
queries (the backend merges a chunk's causal part and its earlier keys by their log-sum-exps),
so a segmented forward equals an uninterrupted one within float32 rounding; the projections,
norms and MLP chunks are computed in the same pieces as in a whole layer."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from prelude.model.attention import AttentionBackend
from prelude.model.layers import MLP_CHUNK_TOKENS

# Tokens per MLP segment, and queries per attention segment (the backend's query chunks). A short
# request waits for at most one segment: beside 8K-token embeddings on the demo model its P99 fell
# from 82-87 ms at 2,048 to 56-58 ms at 1,024 (bench.serving.long_short, fcfs), for 3% more time
# on the long step run alone; 512 gave the same P99 for 12% more.
SEGMENT_TOKENS = 1024

if TYPE_CHECKING:  # the decoder imports this module
    from prelude.model.decoder import DecoderLayer, LayerState


@dataclass(slots=True)
class LayerProgress:
    """How far a layer got: its attention's q/k/v and output so far (heads by KV head), then the
    MLP's input and output so far (tokens)."""

    qkv: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
    attended: torch.Tensor | None = None
    kv_heads_done: int = 0
    chunks_done: int = 0  # of the current KV head's query chunks
    mlp_input: torch.Tensor | None = None
    mlp_output: torch.Tensor | None = None
    tokens_done: int = 0


def worth_segmenting(tokens: int) -> bool:
    """Below one MLP chunk a layer is short enough to run whole."""
    return tokens > MLP_CHUNK_TOKENS


def run_segment(layer: DecoderLayer, state: LayerState, attention: AttentionBackend,
                keep: torch.Tensor | None = None) -> None:
    """Runs the next segment of layer `state.next_layer`, moving on to the next layer after its
    last one. With `keep`, the layer's output projection, norm and MLP run for those tokens only."""
    progress = state.progress
    if progress.mlp_input is None and progress.qkv is None:
        if attention.supports_head_ranges and not attention.fuses_rope:
            _project(layer, state, progress)
        else:  # the backend attends all heads in one call: the attention is one segment
            progress.mlp_input, state.residual = layer.attend(state.x, state.residual, state.rope, attention, keep)
            progress.mlp_output = torch.empty_like(progress.mlp_input)
    elif progress.mlp_input is None:
        _attend_kv_head(layer, state, progress, attention, keep)
    else:
        _mlp_chunk(layer, state, progress)


def _project(layer: DecoderLayer, state: LayerState, progress: LayerProgress) -> None:
    if state.residual is None:
        state.residual, x = state.x, layer.input_layernorm(state.x)
    else:
        x, state.residual = layer.input_layernorm(state.x, state.residual)
    progress.qkv = layer.self_attn.project(x, state.rope)
    progress.attended = torch.empty_like(progress.qkv[0])


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
        out = layer.self_attn.o_proj(attended)
        progress.mlp_input, state.residual = layer.post_attention_layernorm(out, residual)
        progress.mlp_output = torch.empty_like(progress.mlp_input)
        progress.qkv = progress.attended = None


def _mlp_chunk(layer: DecoderLayer, state: LayerState, progress: LayerProgress) -> None:
    assert progress.mlp_input is not None and progress.mlp_output is not None
    start, end = progress.tokens_done, progress.tokens_done + SEGMENT_TOKENS
    progress.mlp_output[start:end] = layer.mlp(progress.mlp_input[start:end])
    progress.tokens_done = min(end, progress.mlp_input.shape[0])
    if progress.tokens_done == progress.mlp_input.shape[0]:
        state.x = progress.mlp_output
        state.progress = LayerProgress()
        state.next_layer += 1
