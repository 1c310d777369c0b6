"""The CUDA executor: ModelExecutor's flattening and output heads, with host->device traffic
through one pinned staging buffer (a single non-blocking copy per step), CUDA-graph replay for
pure decode steps and small single-row OneShot prefills, and a warmup that pays every kernel's
compilation before the server takes requests. Results are the same BatchResult as
ModelExecutor's; only how the forward is launched differs."""
from __future__ import annotations

import logging
import time
from typing import Sequence

import torch

from prelude.engine.batch import (
    DecodeBatch,
    DecodeRow,
    ForwardBatch,
    MixedBatch,
    OneShotBatch,
    OutputSpec,
    PrefillRow,
)
from prelude.engine.sampling import GREEDY
from prelude.executor.attention.base import AttentionBackend, StepLayout
from prelude.executor.cuda_graphs import PREFILL_SIZES, GraphRunner, Kind, decode_sizes
from prelude.executor.model_executor import HostStep, ModelExecutor
from prelude.model.decoder import DecoderLM

logger = logging.getLogger(__name__)


class CudaExecutor(ModelExecutor):
    def __init__(self, model: DecoderLM, attention: AttentionBackend, device: torch.device, *,
                 max_num_seqs: int, max_num_batched_tokens: int, pad_slot: int,
                 enforce_eager: bool = False):
        """`pad_slot`: a KV slot no sequence owns; padded graph rows write there."""
        super().__init__(model, attention, device)
        self.pad_slot = pad_slot
        capacity = max(max_num_batched_tokens, max_num_seqs, max(PREFILL_SIZES)) + 1
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
        if not enforce_eager and hasattr(attention, "plan_graph_decode"):
            prefill = PREFILL_SIZES if getattr(attention, "fuses_rope", False) else ()
            self.graphs = GraphRunner(model, attention, device, decode_sizes(max_num_seqs), prefill)
        elif not enforce_eager:
            logger.info("attention backend %s cannot be captured: CUDA graphs off", type(attention).__name__)
        self._gather = None
        from kernels import available

        if available(device.type):
            from kernels.gather import gather_last

            self._gather = gather_last

    def _forward(self, batch: ForwardBatch, step: HostStep) -> tuple[torch.Tensor, StepLayout]:
        kind, bucket = self._graph_bucket(batch, step)
        if bucket is None:
            return super()._forward(batch, step)
        return self._replay(kind, bucket, step)

    # -- inputs -----------------------------------------------------------------------------
    def _fill(self, step: HostStep, width: int, pad_slot: int) -> int:
        """Writes the step's inputs into the pinned buffer, padded to `width` tokens; returns
        how many columns the device copy must move."""
        n, rows = len(step.ids), len(step.starts)
        if self.copied is not None:
            self.copied.synchronize()
        h = self.host_np
        h[0, :n], h[1, :n], h[2, :n] = step.ids, step.positions, step.slots
        h[0, n:width], h[1, n:width], h[2, n:width] = 0, 0, pad_slot
        h[3, :rows] = step.starts
        return max(width, rows)

    def _upload(self, step: HostStep):
        n = len(step.ids)
        if max(n, len(step.starts)) > self.host.shape[1]:  # an oversize row running alone
            self._starts = None
            return super()._upload(step)
        cols = self._fill(step, n, -1)
        self.staged[:, :cols].copy_(self.host[:, :cols], non_blocking=True)
        self._record_copy()
        self._starts = self.staged[3, : len(step.starts)]
        return self.staged[0, :n], self.staged[1, :n], step.layout(self.staged[2, :n])

    def _record_copy(self) -> None:
        if self.copied is not None:
            self.copied.record()

    # -- graphs -----------------------------------------------------------------------------
    def _graph_bucket(self, batch: ForwardBatch, step: HostStep) -> tuple[Kind | None, int | None]:
        if self.graphs is None:
            return None, None
        if isinstance(batch, DecodeBatch):
            return "decode", self.graphs.bucket("decode", len(batch.rows))
        if isinstance(batch, OneShotBatch) and len(batch.rows) == 1 and batch.rows[0].start == 0:
            return "prefill", self.graphs.bucket("prefill", len(step.ids))
        return None, None

    def _replay(self, kind: Kind, bucket: int, step: HostStep) -> tuple[torch.Tensor, StepLayout]:
        n = len(step.ids)
        # Padding decode rows write their (ignored) K/V to the pad slot; padding prefill tokens
        # follow the real ones in the same causal row and are simply not stored.
        self._fill(step, bucket, self.pad_slot if kind == "decode" else -1)
        if kind == "decode":
            padded = step.layout(self.graphs.static[2, :n])
        else:
            slots = step.slots + [-1] * (bucket - n)
            padded = StepLayout([0, bucket], [0], step.block_tables, [-1 not in slots], 1,
                                self.graphs.static[2, :bucket], host_slots=slots)
        hidden = self.graphs.run(kind, bucket, self.host[:3], padded)
        self._record_copy()
        self._starts = None
        return hidden, step.layout(self.graphs.static[2, :n])

    # -- outputs ----------------------------------------------------------------------------
    def _last_hidden(self, hidden: torch.Tensor, layout: StepLayout, rows: list[int]) -> torch.Tensor:
        num_rows = layout.num_rows
        every_row = len(rows) == num_rows
        if every_row and layout.query_starts[-1] == num_rows:  # one token per row: no gather
            return hidden[:num_rows]
        if every_row and self._gather is not None and self._starts is not None:
            return self._gather(hidden, self._starts)
        return super()._last_hidden(hidden, layout, rows)

    # -- startup ----------------------------------------------------------------------------
    @torch.inference_mode()
    def warmup(self) -> None:
        """Runs one step of every attention path (fresh prefill, prefill over cached context
        with an unstored tail, decode) so kernel compilation and flashinfer's JIT happen now.
        Blocks 0-2 are scribbled on: nothing owns them before the server starts. Graphs are
        left to their first use."""
        start = time.perf_counter()
        bs = self.block_size
        spec = OutputSpec(sample=GREEDY)
        batches: Sequence[ForwardBatch] = [
            OneShotBatch([PrefillRow(-1, [1] * (2 * bs + 3), 0, [], spec)]),
            MixedBatch([PrefillRow(-2, [1] * (bs + 1), bs, [0, 1], spec)], [DecodeRow(-3, 1, 3, [2], spec)]),
            DecodeBatch([DecodeRow(-4, 1, 3, [2], spec)]),
        ]
        graphs, self.graphs = self.graphs, None  # graphs stay lazy: warm the eager path only
        try:
            for batch in batches:
                self.execute(batch)
        finally:
            self.graphs = graphs
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        logger.info("CUDA warmup in %.2fs (attention %s, ops %s, graphs %s)", time.perf_counter() - start,
                    type(self.attention).__name__, self.model.model.norm.ops.name,
                    "lazy" if self.graphs is not None else "off")
