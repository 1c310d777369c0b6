"""CUDA graphs of the forward in pieces, attention run eagerly between them: for the steps no
whole-step graph takes (rows over a cached prefix, multi-item rows, prompt chunks beside
decodes), which would otherwise launch every kernel of every layer from Python (~15 ms a step
of the 0.6B, whatever its size; `python -m bench.serving.gpu_profile`).

A bucket's pieces are captured by running the model once with a backend that, where the model
calls attention, runs the backend's capture-safe first half (`store`: q/k norms, RoPE, the K/V
write, over every token of the bucket, the padding's slots -1), copies q, k and v into shared
buffers, ends the capture and begins the next one, returning the shared output buffer: piece i
is everything from layer i-1's attention to layer i's (the first starts at the embedding, the
last ends after the final norm). A replay runs piece 0, then per layer the backend's second
half (`attend`, planned as the eager step is, on the step's n real tokens) and piece i+1: the
only Python launching per layer is the attention kernels'. The padding tokens' rows go through
the per-token layers with whatever the output buffer holds there, and no real token reads them.
Backends that do not fuse RoPE (and so cannot split their calls) get no pieces.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from prelude.model.attention import AttentionBackend, StepLayout

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class AttentionBuffers:
    """What crosses between pieces, shared by every layer and bucket (a bucket uses the first
    rows): the attention's inputs and output. Sharing them keeps one layer's worth alive, not
    one per layer."""

    q: torch.Tensor  # [max_tokens, heads, head_dim]
    k: torch.Tensor  # [max_tokens, kv_heads, head_dim]
    v: torch.Tensor
    out: torch.Tensor  # [max_tokens, heads, head_dim]

    def attend(self, attention: AttentionBackend, layer: int, n: int) -> None:
        """One layer's attention over the step's n real tokens, into the output buffer."""
        self.out[:n].copy_(attention.attend(layer, self.q[:n], self.k[:n], self.v[:n]))


class Pieces:
    """A bucket's captured pieces: replay() runs them with the real attention between them."""

    def __init__(self, graphs: Sequence, layers: Sequence[int], hidden: torch.Tensor):
        assert len(graphs) == len(layers) + 1
        self.graphs, self.layers, self.hidden = list(graphs), list(layers), hidden

    def replay(self, attention: AttentionBackend, buffers: AttentionBuffers, n: int,
               on_launch: Callable[[], None] | None = None) -> torch.Tensor:
        self.graphs[0].replay()
        if on_launch is not None:
            on_launch()
        for layer, graph in zip(self.layers, self.graphs[1:]):
            buffers.attend(attention, layer, n)
            graph.replay()
        return self.hidden


class SlicedAttention(AttentionBackend):
    """A replay's attention in one eager call: `store` over the whole padded step at `slots`,
    `attend` over its first n tokens, the rest of the output zero. The eager run before a
    capture (lazy initialization must not land in a capture), and the stand-in for replaying
    pieces where nothing can be captured (tests on the CPU)."""

    def __init__(self, attention: AttentionBackend, n: int, slots: torch.Tensor):
        self.attention, self.n, self.slots = attention, n, slots
        self.fuses_rope = attention.fuses_rope

    def plan(self, layout: StepLayout) -> None:
        raise AssertionError("the runner plans the real backend")

    def __call__(self, layer, q, k, v, rope=None, qk_norm=None):
        n = self.n
        q, k = self.attention.store(layer, q, k, v, rope, qk_norm, self.slots)
        out = torch.zeros(q.shape, dtype=q.dtype, device=q.device)
        out[:n] = self.attention.attend(layer, q[:n], k[:n], v[:n])
        return out


class _Splitter(AttentionBackend):
    """The backend the model sees while its pieces are captured: ends one capture and begins the
    next where attention would run, its first half captured in the piece before."""

    def __init__(self, attention: AttentionBackend, buffers: AttentionBuffers, slots: torch.Tensor, pool):
        self.attention, self.buffers, self.slots, self.pool = attention, buffers, slots, pool
        self.fuses_rope = attention.fuses_rope
        self.graphs: list[torch.cuda.CUDAGraph] = []
        self.layers: list[int] = []

    def begin(self) -> None:
        graph = torch.cuda.CUDAGraph()
        graph.capture_begin(pool=self.pool)
        self.graphs.append(graph)

    def end(self) -> None:
        self.graphs[-1].capture_end()

    def plan(self, layout: StepLayout) -> None:
        raise AssertionError("the runner plans the real backend")

    def __call__(self, layer, q, k, v, rope=None, qk_norm=None):
        q, k = self.attention.store(layer, q, k, v, rope, qk_norm, self.slots)
        tokens, buffers = q.shape[0], self.buffers
        buffers.q[:tokens].copy_(q)
        buffers.k[:tokens].copy_(k)
        buffers.v[:tokens].copy_(v)
        self.end()
        self.layers.append(layer)
        self.begin()
        return buffers.out[:tokens]


class PiecewiseGraphs:
    """Pieces per token bucket, captured lazily the first time a bucket is used."""

    def __init__(self, model, attention: AttentionBackend, static: torch.Tensor, sizes: Sequence[int]):
        """`static`: the whole-step graphs' [3, >= max(sizes)] input buffer (ids, positions, KV
        slots), which the runner fills before a replay and the pieces read too (the two never
        run at once); `sizes`: the token buckets."""
        self.model, self.attention, self.static = model, attention, static
        self.sizes = list(sizes)
        tokens, device = max(self.sizes), static.device
        assert static.shape[1] >= tokens
        c, dtype = model.config, model.model.embed_tokens.weight.dtype
        self.buffers = AttentionBuffers(
            torch.zeros(tokens, c.num_heads, c.head_dim, dtype=dtype, device=device),
            torch.zeros(tokens, c.num_kv_heads, c.head_dim, dtype=dtype, device=device),
            torch.zeros(tokens, c.num_kv_heads, c.head_dim, dtype=dtype, device=device),
            torch.zeros(tokens, c.num_heads, c.head_dim, dtype=dtype, device=device))
        self.pieces: dict[int, Pieces] = {}
        self.pool = torch.cuda.graph_pool_handle() if device.type == "cuda" else None

    def run(self, bucket: int, n: int, on_launch: Callable[[], None] | None = None) -> torch.Tensor:
        """The bucket's final hidden states, its first n tokens the step's (the attention
        backend is planned for those n); a view of the pieces' output: read it before the next
        replay."""
        pieces = self.pieces.get(bucket)
        if pieces is None:
            pieces = self.pieces[bucket] = self._capture(bucket, n)
        return pieces.replay(self.attention, self.buffers, n, on_launch)

    def _capture(self, bucket: int, n: int) -> Pieces:
        start = time.perf_counter()
        ids, positions = self.static[0, :bucket], self.static[1, :bucket]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        slots = self.static[2, :bucket]
        with torch.cuda.stream(side):
            self.model(ids, positions, SlicedAttention(self.attention, n, slots))
            splitter = _Splitter(self.attention, self.buffers, slots, self.pool)
            splitter.begin()
            hidden = self.model(ids, positions, splitter)
            splitter.end()
        torch.cuda.current_stream().wait_stream(side)
        logger.info("captured %d pieces for %d tokens in %.0f ms", len(splitter.graphs), bucket,
                    1000 * (time.perf_counter() - start))
        return Pieces(splitter.graphs, splitter.layers, hidden)
