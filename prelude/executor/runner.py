"""The model runner the three executors share: one model on one device with its attention
backend. It flattens rows (host_step), uploads them, runs the forward, and applies the output
heads. This class runs every step eagerly; CudaModelRunner adds staging and graph replay. Where
it is given a native step (executor.fused_step: the CPU in fp32), a step's layers run in one
native call when the step fits it, else through the model layer by layer."""
from __future__ import annotations

import functools
import os
import struct
from array import array
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Sequence, TypeVar, cast

import torch

from prelude.contract.batch import BatchResult, DecodeRow, PrefillRow
from prelude.executor.fused_step import FusedStep
from prelude.executor.heads import row_results
from prelude.executor.host_step import HostStep, host_step
from prelude.model.attention import AttentionBackend, GraphKind, StepLayout
from prelude.executor.runnable import RunnableModel
from prelude.contract.stop import StopFlag
from prelude.model.decoder import ResumableForward
from prelude.structured.masks import StepMasks, start_step_masks

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(slots=True)
class Progress:
    """A prefill step that may be parked: its rows, its layout, and the model's forward."""

    prefills: Sequence[PrefillRow]
    layout: StepLayout
    forward: ResumableForward
    read: list[int] | None  # the positions whose states the forward keeps (None: all)
    masks: Future[StepMasks] | None
    parks: int = 0  # how many times it stepped aside for another step


def in_inference_mode(method: F) -> F:
    """Runs the method in torch's inference mode, entering it unless the calling thread already
    holds it, as the engine's step thread does for its life (thread_context): torch's
    own decorator makes a context object and enters and leaves it every call, some 70 bytecodes
    a step."""
    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if torch.is_inference_mode_enabled():
            return method(*args, **kwargs)
        with torch.inference_mode():
            return method(*args, **kwargs)
    return cast(F, wrapper)


class ModelRunner:
    def __init__(self, model: RunnableModel, attention: AttentionBackend, device: torch.device, block_size: int,
                 native: FusedStep | None = None):
        self.model = model
        self.attention = attention
        self.device = device
        self.block_size = block_size
        self.native = native  # the model's layers in one native call (fused_step.native_step), or None
        self._on_host = device.type == "cpu"
        # Whether a core is free while the forward runs, for the grammar masks' thread: always
        # beside a GPU's, on the CPU only when torch's threads (set before the runner) leave one.
        self._masks_beside_forward = not self._on_host or (os.cpu_count() or 1) > torch.get_num_threads()

    @in_inference_mode
    def run(self, prefills: Sequence[PrefillRow], decodes: Sequence[DecodeRow],
            graph: GraphKind | None = None, on_launch: Callable[[], None] | None = None) -> BatchResult:
        """One step over these rows; `graph` names the CUDA-graph shape the step has, when the
        calling executor knows it has one (the runner decides whether a bucket fits).
        `on_launch` is called as the forward's kernels start, which run without the GIL (see
        engine.decode_chain.DecodeChain)."""
        step = host_step(prefills, decodes, self.block_size)
        masks = start_step_masks(prefills, decodes, self._masks_beside_forward)
        hidden, layout, read = self.forward(step, graph, on_launch)
        return BatchResult(row_results(self.model, hidden, prefills, decodes, layout, self.last_hidden, masks, read))

    @in_inference_mode
    def start(self, prefills: Sequence[PrefillRow], stop: StopFlag) -> Progress:
        """A prefill-only step that steps aside when `stop` is raised, to be run with `advance`."""
        step = host_step(prefills, (), self.block_size)
        input_ids, positions, layout = self.upload(step)
        self.attention.plan(layout)
        keep = self._kept(step)
        forward: ResumableForward | None = None
        if self.native is not None:  # it looks at the flag inside layers, at no cost while it stays down
            forward = self.native.begin(input_ids, positions, self.attention, keep, stop.check_every_macs)
        if forward is None:
            forward = self.model.begin(input_ids, positions, self.attention, keep, stop)
        return Progress(prefills, layout, forward, None if keep is None else step.read,
                        start_step_masks(prefills, (), self._masks_beside_forward))

    @in_inference_mode
    def advance(self, progress: Progress, stop: StopFlag) -> BatchResult | None:
        """Runs the step on until it finished (its results) or saw `stop` raised (None: the step
        is parked, and another step may run)."""
        if progress.parks:  # a step that ran meanwhile planned the attention for itself
            self.attention.plan(progress.layout)
        hidden = progress.forward.advance(self.attention, stop)
        if hidden is None:
            progress.parks += 1
            return None
        return BatchResult(row_results(self.model, hidden, progress.prefills, (), progress.layout, self.last_hidden,
                                       progress.masks, progress.read))

    def has_graph(self, kind: GraphKind, tokens: int, rows: int) -> bool:
        """Whether a step of this kind, tokens and rows replays a CUDA graph."""
        return False

    def forward(self, step: HostStep, graph: GraphKind | None,
                on_launch: Callable[[], None] | None = None) -> tuple[torch.Tensor, StepLayout, list[int] | None]:
        """Final hidden states of the step's tokens that the heads read, the layout they were
        computed in, and which positions the states are of: those of step.read, in order, where
        the model skipped the others (row_results maps them), else None: every position's."""
        input_ids, positions, layout = self.upload(step)
        self.attention.plan(layout)
        keep = self._kept(step)
        hidden = None
        if self.native is not None:
            hidden = self.native.try_forward(input_ids, positions, self.attention, keep, on_launch)
        if hidden is None:
            hidden = self.model(input_ids, positions, self.attention, keep, on_launch)
        return hidden, layout, None if keep is None else step.read

    def upload(self, step: HostStep) -> tuple[torch.Tensor, torch.Tensor, StepLayout]:
        return self._to_device(step.ids), self._to_device(step.positions), step.layout(self._to_device(step.slots))

    def _kept(self, step: HostStep) -> torch.Tensor | None:
        """The tokens whose final states the heads read, when that is not all of them and the
        model spares the others."""
        if step.read is None or not self.model.skips_unread_tokens:
            return None
        return self._to_device(_int64(step.read) if step.read else torch.empty(0, dtype=torch.long))

    def _to_device(self, host: torch.Tensor) -> torch.Tensor:
        return host if self._on_host else host.to(self.device, non_blocking=True)

    def last_hidden(self, hidden: torch.Tensor, layout: StepLayout, rows: list[int]) -> torch.Tensor:
        return last_positions(hidden, layout, rows)

    def warmup(self) -> None:
        """One-time costs before serving: none on the CPU, whose weights are stored for its
        kernels as they load (DecoderLM.store_weights)."""

    @staticmethod
    def thread_context() -> ContextManager[Any]:
        """What the thread that runs the steps holds for its life: torch's inference mode, which
        the runner would otherwise enter and leave every step (in_inference_mode)."""
        return torch.inference_mode()


def last_positions(hidden: torch.Tensor, layout: StepLayout, rows: list[int]) -> torch.Tensor:
    """Final hidden state of the last position of each of `rows` (step row indices, ascending)."""
    ends = layout.query_starts
    first, last = ends[rows[0] + 1] - 1, ends[rows[-1] + 1] - 1
    if last - first == len(rows) - 1:  # consecutive: one request, or a step's decode rows
        return hidden[first:last + 1]  # a view: no index tensor to build, no copy
    return hidden[torch.tensor([ends[i + 1] - 1 for i in rows], device=hidden.device)]


def _int64(values: list[int]) -> torch.Tensor:
    """A list of ints as an int64 tensor. array('q') parses each int as a call's argument; struct
    converts them in half its time once there are some hundreds, but its setup costs more than
    that saves below about 50 (a decode step's few rows)."""
    if len(values) < 48:
        return torch.frombuffer(array("q", values), dtype=torch.long)
    buffer = bytearray(8 * len(values))
    struct.pack_into(f"{len(values)}q", buffer, 0, *values)
    return torch.frombuffer(buffer, dtype=torch.long)
