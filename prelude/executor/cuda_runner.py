"""The CUDA model runner: ModelRunner's flattening and output heads, with host->device traffic
through one pinned staging buffer (a single non-blocking copy per step), CUDA-graph replay of
the step shapes the executors name (pure decode steps, steps of fresh prefill rows) and of
every other step in pieces around its attention (piecewise_graphs), and a warmup that pays
every kernel's compilation before the server takes requests.
Results are the same as ModelRunner's; only how the forward is launched differs."""
from __future__ import annotations

import logging
import time
from typing import Callable

import torch

from prelude.contract.batch import DecodeRow, OutputSpec, PrefillRow
from prelude.contract.sampling import GREEDY
from prelude.executor.cuda_graphs import GraphRunner, decode_sizes, pick_bucket, prefill_sizes
from prelude.executor.host_step import HostStep
from prelude.executor.piecewise_graphs import PiecewiseGraphs
from prelude.executor.runner import ModelRunner
from prelude.model.attention import AttentionBackend, GraphKind, StepLayout
from prelude.model.decoder import DecoderLM

logger = logging.getLogger(__name__)


class CudaModelRunner(ModelRunner):
    def __init__(self, model: DecoderLM, attention: AttentionBackend, device: torch.device, block_size: int, *,
                 max_num_seqs: int, max_num_batched_tokens: int, pad_slot: int,
                 enforce_eager: bool = False):
        """`pad_slot`: a KV slot no sequence owns; padded graph rows write there."""
        super().__init__(model, attention, device, block_size)
        self.decoder = model  # the runner's model, with the DecoderLM parts graphs and logs read
        self.pad_slot = pad_slot
        capacity = max(max_num_batched_tokens, max_num_seqs) + 1
        # Rows: token ids, positions, KV slots, row offsets (query_starts).
        on_cuda = device.type == "cuda"  # the CPU case exists for tests only
        self.host = torch.zeros(4, capacity, dtype=torch.long, pin_memory=on_cuda)
        self.host_np = self.host.numpy()
        self.staged = torch.zeros(4, capacity, dtype=torch.long, device=device)
        # Marks the last copy out of `host`: wait on it before refilling the buffer, since a
        # step without outputs never synchronizes with the device.
        self.copied = torch.cuda.Event() if on_cuda else None
        self._record_copy()
        self._starts: torch.Tensor | None = None
        self.graphs: GraphRunner | None = None
        self.pieces: PiecewiseGraphs | None = None
        if not enforce_eager:
            if "decode" in attention.graph_kinds:
                sizes = prefill_sizes(max_num_batched_tokens, _layer_weights(model.config))
                prefill = sizes if "prefill" in attention.graph_kinds else ()
                self.graphs = GraphRunner(model, attention, device, decode_sizes(max_num_seqs), prefill,
                                          max_prefill_rows=max_num_seqs)
                if "prefill" in attention.graph_kinds:  # its calls split around the capture-safe KV write
                    self.pieces = PiecewiseGraphs(model, attention, self.graphs.static, sizes)
            else:
                logger.info("attention backend %s cannot be captured: CUDA graphs off", type(attention).__name__)
        self._gather = None
        from kernels import available

        if available(device.type):
            from kernels.gather import gather_last

            self._gather = gather_last

    def forward(self, step: HostStep, graph: GraphKind | None,
                on_launch: Callable[[], None] | None = None) -> tuple[torch.Tensor, StepLayout, list[int] | None]:
        bucket = self._graph_bucket(graph, step)
        if graph is not None and bucket is not None:
            hidden, layout = self._replay(graph, bucket, step)
            if on_launch is not None:  # the replay is queued: the host waits for it from here
                on_launch()
            return hidden, layout, None  # a graph computes every position's state
        bucket = None if self.pieces is None else pick_bucket(step.num_tokens, self.pieces.sizes)
        if bucket is None:
            return super().forward(step, None, on_launch)
        return *self._replay_pieces(bucket, step, on_launch), None

    # -- inputs -----------------------------------------------------------------------------
    def _fill(self, step: HostStep, width: int, pad_slot: int) -> int:
        """Writes the step's inputs into the pinned buffer, padded to `width` tokens; returns
        how many columns the device copy must move."""
        n, rows = step.num_tokens, len(step.starts)
        if self.copied is not None:
            self.copied.synchronize()
        h = self.host_np
        h[:3, :n] = step.tokens.numpy()
        h[0, n:width], h[1, n:width], h[2, n:width] = 0, 0, pad_slot
        h[3, :rows] = step.starts
        return max(width, rows)

    def upload(self, step: HostStep) -> tuple[torch.Tensor, torch.Tensor, StepLayout]:
        n = step.num_tokens
        if max(n, len(step.starts)) > self.host.shape[1]:  # an oversize row running alone
            self._starts = None
            return super().upload(step)
        cols = self._fill(step, n, -1)
        self.staged[:, :cols].copy_(self.host[:, :cols], non_blocking=True)
        self._record_copy()
        self._starts = self.staged[3, : len(step.starts)]
        return self.staged[0, :n], self.staged[1, :n], step.layout(self.staged[2, :n])

    def _record_copy(self) -> None:
        if self.copied is not None:
            self.copied.record()

    # -- graphs -----------------------------------------------------------------------------
    def has_graph(self, kind: GraphKind, tokens: int, rows: int) -> bool:
        return self.graphs is not None and self.graphs.bucket(kind, tokens, rows) is not None

    def _graph_bucket(self, graph: GraphKind | None, step: HostStep) -> int | None:
        if self.graphs is None or graph is None:
            return None
        return self.graphs.bucket(graph, step.num_tokens, step.num_rows)

    def _replay(self, kind: GraphKind, bucket: int, step: HostStep) -> tuple[torch.Tensor, StepLayout]:
        assert self.graphs is not None
        n = step.num_tokens
        # Padding decode rows write their (ignored) K/V to the pad slot. Padding prefill tokens
        # form one row of their own after the real ones (attending only among themselves) and
        # are not stored; the graph's remaining rows are empty.
        self._fill(step, bucket, self.pad_slot if kind == "decode" else -1)
        if kind == "decode":
            padded = step.layout(self.graphs.static[2, :n])
        else:
            rows = self.graphs.prefill_rows(bucket)
            slots = step.slots.tolist() + [-1] * (bucket - n)
            starts = step.starts + [bucket] * (rows + 1 - len(step.starts))
            padded = StepLayout(starts, [0] * rows, [()] * rows, step.stored + [False] * (rows - step.num_rows),
                                rows, self.graphs.static[2, :bucket], host_slots=slots)
        hidden = self.graphs.run(kind, bucket, self.host[:3], padded)
        self._record_copy()
        self._starts = None
        return hidden, step.layout(self.graphs.static[2, :n])

    def _replay_pieces(self, bucket: int, step: HostStep,
                       on_launch: Callable[[], None] | None) -> tuple[torch.Tensor, StepLayout]:
        """The step padded to `bucket` through the bucket's pieces; attention is planned as for
        the eager step, on its own tokens (the padding's ids, positions and slots are 0, 0, -1)."""
        assert self.pieces is not None
        n = step.num_tokens
        self._fill(step, bucket, -1)
        static = self.pieces.static
        static[:, :bucket].copy_(self.host[:3, :bucket], non_blocking=True)
        layout = step.layout(static[2, :n])
        self.attention.plan(layout)
        hidden = self.pieces.run(bucket, n, on_launch)
        self._record_copy()
        self._starts = None
        return hidden[:n], layout

    # -- outputs ----------------------------------------------------------------------------
    def last_hidden(self, hidden: torch.Tensor, layout: StepLayout, rows: list[int]) -> torch.Tensor:
        num_rows = layout.num_rows
        every_row = len(rows) == num_rows
        if every_row and layout.query_starts[-1] == num_rows:  # one token per row: no gather
            return hidden[:num_rows]
        if every_row and self._gather is not None and self._starts is not None:
            return self._gather(hidden, self._starts)
        return super().last_hidden(hidden, layout, rows)

    # -- startup ----------------------------------------------------------------------------
    def warmup(self) -> None:
        """Runs one step of every attention path (fresh prefill, prefill over cached context
        with an unstored tail, decode) so kernel compilation and flashinfer's JIT happen now.
        Blocks 0-2 are scribbled on: nothing owns them before the server starts. Graphs are
        left to their first use: warmup runs every step eagerly."""
        start = time.perf_counter()
        bs = self.block_size
        spec = OutputSpec(sample=GREEDY)
        pieces, self.pieces = self.pieces, None  # eager steps: capturing waits for first use
        try:
            self.run([PrefillRow(-1, [1] * (2 * bs + 3), 0, [], spec)], ())
            self.run([PrefillRow(-2, [1] * (bs + 1), bs, [0, 1], spec)], [DecodeRow(-3, 1, 3, [2], spec)])
            self.run((), [DecodeRow(-4, 1, 3, [2], spec)])
        finally:
            self.pieces = pieces
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        logger.info("CUDA warmup in %.2fs (attention %s, ops %s, graphs %s)", time.perf_counter() - start,
                    type(self.attention).__name__, self.decoder.model.norm.ops.name,
                    "lazy" if self.graphs is not None else "off")


def _layer_weights(config) -> int:
    """Weights of one decoder layer's projections: what a prefill step's kernel time grows with."""
    c = config
    return (c.hidden_size * (c.num_heads + 2 * c.num_kv_heads) * c.head_dim + c.num_heads * c.head_dim * c.hidden_size
            + 3 * c.hidden_size * c.intermediate_size)
