"""CUDA graphs of the model forward at fixed token counts ("buckets").

Pure decode steps are padded to the next decode bucket (1, 2, 4, ... up to max_num_seqs) and
replayed from a graph captured for that bucket: one launch instead of a few hundred, which is
most of a small model's decode step. Single-row OneShot prefills up to 1,024 tokens are
launch-bound the same way (the host launching hundreds of operations takes longer than their
kernels; `python -m bench.serving.gpu_profile`) and get their own buckets. Graphs are captured
lazily, the first time a bucket is used, so startup pays nothing.

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

PREFILL_SIZES = (32, 64, 128, 256, 512, 1024)


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
                 prefill: Sequence[int] = ()):
        self.model = model
        self.attention = attention
        self.decode_sizes = list(decode)
        self.prefill_sizes = list(prefill)
        self.max_tokens = max(self.decode_sizes + self.prefill_sizes)
        self.static = torch.zeros(3, self.max_tokens, dtype=torch.long, device=device)
        self.graphs: dict[tuple[Kind, int], _Captured] = {}
        # One memory pool shared by all graphs (they never run concurrently); the first capture
        # creates it. torch names its handle type only privately (the annotation is not evaluated).
        self.pool: torch.cuda._POOL_HANDLE | None = None

    def bucket(self, kind: Kind, n: int) -> int | None:
        return pick_bucket(n, self.decode_sizes if kind == "decode" else self.prefill_sizes)

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
