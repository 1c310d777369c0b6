"""CUDA graphs of the model forward at fixed token counts ("buckets").

Pure decode steps are padded to the next decode bucket (1, 2, 4, ... up to max_num_seqs) and
replayed from a graph captured for that bucket: one launch instead of a few hundred, which is
most of a small model's decode step. Steps of fresh prefill rows (no cached context, no items)
are launch-bound the same way well past a thousand tokens (an eager step of the 0.6B spends
~15 ms launching kernels whatever its size; `python -m bench.serving.gpu_profile`), so they are
padded to a prefill bucket by their total tokens, whatever their row count, and replay one
graph. Graphs are captured lazily, the first time a bucket is used, so startup pays nothing.

Inputs live in one static device buffer (ids, positions, KV slots) that every graph reads; the
executor copies each step's padded inputs into it from pinned memory, the attention backend
plans its bucket's wrapper, then the graph replays.
"""
from __future__ import annotations

import bisect
import logging
import time
from dataclasses import dataclass, replace
from typing import Sequence

import torch

from prelude.model.attention import GraphKind as Kind, StepLayout

logger = logging.getLogger(__name__)

# Prefill buckets: powers of two, and from 512 up the midpoints between them too, so that padding
# adds at most half a small step's tokens and a third of a big one's.
PREFILL_GRID = (32, 64, 128, 256, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384)
# Prefill steps replay a graph while tokens x one layer's weights stays under this: about where a
# step's kernels start to take longer than launching them eagerly (the 0.6B's 15.7M weights a
# layer at 8,192 tokens; 1,276 for the 4B's 101M; gpu_profile's graph and eager rows). Past it a
# graph saves only host time, and padding to the next bucket would cost more kernel time.
PREFILL_GRAPH_WORK = 8192 * 15_728_640


def prefill_sizes(max_num_batched_tokens: int, layer_weights: int) -> list[int]:
    """The prefill buckets up to the smaller of the step budget and PREFILL_GRAPH_WORK's limit
    for this model, that limit itself the last (so every step under it has a bucket)."""
    limit = min(max_num_batched_tokens, max(PREFILL_GRID[0], PREFILL_GRAPH_WORK // max(1, layer_weights)))
    return [size for size in PREFILL_GRID if size < limit] + [limit]


def decode_sizes(max_num_seqs: int) -> list[int]:
    """Powers of two below max_num_seqs, then max_num_seqs itself."""
    sizes, size = [], 1
    while size < max_num_seqs:
        sizes.append(size)
        size *= 2
    return sizes + [max_num_seqs]


def pick_bucket(n: int, sizes: Sequence[int]) -> int | None:
    """The smallest size >= n, or None when n exceeds them all (the step runs eagerly)."""
    i = bisect.bisect_left(sizes, n)
    return sizes[i] if i < len(sizes) and n > 0 else None


@dataclass(slots=True)
class _Captured:
    graph: torch.cuda.CUDAGraph
    hidden: torch.Tensor  # the graph's output: final hidden states of the bucket's tokens


class GraphRunner:
    def __init__(self, model, attention, device: torch.device, decode: Sequence[int],
                 prefill: Sequence[int] = (), max_prefill_rows: int = 1):
        """`max_prefill_rows`: the most rows of a step a prefill graph takes. flashinfer's
        graph-mode prefill has a fixed row count: a bucket's graph has one row more than that
        (or one per token), the padding tokens' row, and the rows a step does not use are empty."""
        self.model = model
        self.attention = attention
        self.decode_sizes = list(decode)
        self.prefill_sizes = list(prefill)
        self.max_prefill_rows = max_prefill_rows
        self.max_tokens = max(self.decode_sizes + self.prefill_sizes)
        self.static = torch.zeros(3, self.max_tokens, dtype=torch.long, device=device)
        self.graphs: dict[tuple[Kind, int], _Captured] = {}
        # One memory pool shared by all graphs (they never run concurrently); the first capture
        # creates it. torch names its handle type only privately (the annotation is not evaluated).
        self.pool: torch.cuda._POOL_HANDLE | None = None

    def bucket(self, kind: Kind, tokens: int, rows: int) -> int | None:
        """The bucket a step of this many tokens and rows replays, or None (it runs eagerly):
        decode buckets count rows, prefill buckets tokens."""
        if kind == "decode":
            return pick_bucket(rows, self.decode_sizes)
        size = pick_bucket(tokens, self.prefill_sizes)
        return size if size is not None and rows <= self.max_prefill_rows else None

    def prefill_rows(self, bucket: int) -> int:
        """The row count of a prefill bucket's graph: room for the step's rows and the padding's
        (a row has at least one token, so a step of `bucket` rows has no padding)."""
        return min(bucket, self.max_prefill_rows + 1)

    def run(self, kind: Kind, bucket: int, host: torch.Tensor, layout: StepLayout) -> torch.Tensor:
        """host: [3, >= bucket] padded ids/positions/slots (pinned); layout: the padded step.
        Returns the bucket's hidden states (a view of the graph's output: read it before the
        next replay)."""
        self.static[:, :bucket].copy_(host[:, :bucket], non_blocking=True)
        layout = replace(layout, slot_mapping=self.static[2, :bucket])
        self.attention.plan_graph(kind, layout, bucket)
        captured = self.graphs.get((kind, bucket))
        if captured is None:
            captured = self.graphs[(kind, bucket)] = self._capture(kind, bucket)
        captured.graph.replay()
        return captured.hidden

    def _capture(self, kind: Kind, bucket: int) -> _Captured:
        start = time.perf_counter()
        ids, positions = self.static[0, :bucket], self.static[1, :bucket]
        # One eager run on a side stream first, as torch's graph docs require: lazy
        # initialization (cuBLAS workspaces, Triton autotuning) must not land in the capture.
        # It recomputes exactly what the replay will, so its KV writes are harmless.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self.model(ids, positions, self.attention)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            hidden = self.model(ids, positions, self.attention)
        self.pool = graph.pool()
        logger.info("captured %s graph for %d tokens in %.0f ms", kind, bucket,
                    1000 * (time.perf_counter() - start))
        return _Captured(graph, hidden)
