"""The model runner the three executors share: one model on one device with its attention
backend. It flattens rows (host_step), uploads them, runs the forward, and applies the output
heads. This class runs every step eagerly; CudaModelRunner adds staging and graph replay."""
from __future__ import annotations

from array import array
from typing import Sequence

import torch

from prelude.contract.batch import BatchResult, DecodeRow, PrefillRow
from prelude.executor.heads import row_results
from prelude.executor.host_step import HostStep, host_step
from prelude.model.attention import AttentionBackend, GraphKind, StepLayout
from prelude.model.decoder import DecoderLM


class ModelRunner:
    def __init__(self, model: DecoderLM, attention: AttentionBackend, device: torch.device, block_size: int):
        self.model = model
        self.attention = attention
        self.device = device
        self.block_size = block_size

    @torch.inference_mode()
    def run(self, prefills: Sequence[PrefillRow], decodes: Sequence[DecodeRow],
            graph: GraphKind | None = None) -> BatchResult:
        """One step over these rows; `graph` names the CUDA-graph shape the step has, when the
        calling executor knows it has one (the runner decides whether a bucket fits)."""
        step = host_step(prefills, decodes, self.block_size)
        hidden, layout = self.forward(step, graph)
        return BatchResult(row_results(self.model, hidden, prefills, decodes, layout, self.last_hidden))

    def forward(self, step: HostStep, graph: GraphKind | None) -> tuple[torch.Tensor, StepLayout]:
        """Final hidden states of every token of the step, and the layout they were computed in."""
        input_ids, positions, layout = self.upload(step)
        self.attention.plan(layout)
        return self.model(input_ids, positions, self.attention), layout

    def upload(self, step: HostStep) -> tuple[torch.Tensor, torch.Tensor, StepLayout]:
        return self._to_device(step.ids), self._to_device(step.positions), step.layout(self._to_device(step.slots))

    def _to_device(self, values: list[int]) -> torch.Tensor:
        # array('q') + frombuffer converts a long list several times faster than torch.tensor.
        host = torch.frombuffer(array("q", values), dtype=torch.long) if values else torch.empty(0, dtype=torch.long)
        return host.to(self.device, non_blocking=True)

    def last_hidden(self, hidden: torch.Tensor, layout: StepLayout, rows: list[int]) -> torch.Tensor:
        """Final hidden state of the last position of each of `rows` (step row indices)."""
        index = torch.tensor([layout.query_starts[i + 1] - 1 for i in rows], device=hidden.device)
        return hidden[index]

    def warmup(self) -> None:
        """Pay one-time costs (kernel compilation) before serving; nothing to pay on the CPU."""
