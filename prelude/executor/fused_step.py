"""A step's decoder layers in one native call on the CPU (kernels/cpu/step_layers.hpp).

Run op by op, a step of a small model on the CPU is mostly overhead: per layer a dozen torch
dispatches, tensor allocations and GIL hand-offs. A decode step's few rows cost less arithmetic
than that: most of a small model's decode step is spent holding the GIL. A prompt step gives
the GIL up at every op, and in the server the event loop takes it in between, so the same step
runs slower while tokens stream than alone.
This runs the same kernels the per-op path calls, for every layer and the final norm, in one
call without the GIL. It takes only what it was written for: fp32 activations on the CPU, the
projections stored packed (in fp32, bf16 or int8), a step whose
backend exposes its paged cache and row layout (AttentionBackend.paged_step_inputs), and sizes
the vector kernels take; every other step runs layer by layer (DecoderLM.forward). The same step
can run resumably (NativeForward), stepping aside when the engine's StopFlag goes up
(engine.preemption). The model runner chooses it (`native_step`): the model knows nothing of it."""
from __future__ import annotations

from typing import Callable, Protocol, cast

import torch

from prelude.contract.stop import StopFlag
from prelude.model.attention import AttentionBackend, PagedStepInputs
from prelude.model.encoder import EncoderLM
from prelude.model.decoder import DecoderLayer, DecoderLM
from prelude.model.cpu_linear import FORMATS, PANELS, StoredWeight
from prelude.model.native_decoder import ONE_THREAD_LAYER_WEIGHTS
from prelude.model.ops import Ops

StepKernel = Callable[..., None]  # kernels/cpu/_native.pyi: forward_step
ResumableKernel = Callable[..., "NativeSteps"]  # kernels/cpu/_native.pyi: ResumableStep

# LayerWeights' fields (kernels/cpu/step_layers.hpp): seven pointers, then four weights of four.
_WEIGHT_FIELDS = 23


def native_step(model: DecoderLM | EncoderLM, ops: Ops) -> FusedStep | None:
    """The one-call step of `model` on `ops`, where the ops have a native step and the model (a
    decoder: the kernel runs causal layers) its parameters and sizes fit it; else None (the
    runner runs the model layer by layer)."""
    if ops.forward_step is None or not isinstance(model, DecoderLM) or not FusedStep.fits(model):
        return None
    return FusedStep(model, ops.forward_step, ops.resumable_step)


class FusedStep:
    """Binds a loaded model's parameters to the native step kernel."""

    def __init__(self, model: DecoderLM, kernel: StepKernel, resumable: ResumableKernel | None = None):
        self.model = model
        self.kernel = kernel
        self.resumable = resumable
        self._pointers: tuple[int, int, torch.Tensor] | None = None  # (k ptr, v ptr, table)
        layers = model.model.layers
        layer_weights = sum(w.outputs * w.inputs for w in _projections(cast(DecoderLayer, layers[0]))) if len(
            layers) else 0
        self.single_threaded_decode = layer_weights < ONE_THREAD_LAYER_WEIGHTS

    @staticmethod
    def fits(model: DecoderLM) -> bool:
        """The model's parameters and sizes are ones the kernel takes: its projections stored
        packed (DecoderLM.store_weights), the rest fp32 on the CPU."""
        c = model.config
        packed = all(linear.stored is not None and linear.stored.layout == PANELS
                     for layer in model.model.layers for linear in cast(DecoderLayer, layer).projections())
        fp32 = all(p.dtype == torch.float32 and p.device.type == "cpu" and p.is_contiguous()
                   for p in model.parameters())
        return (packed and fp32
                and c.hidden_size % 8 == 0 and c.intermediate_size % 8 == 0 and c.head_dim % 16 == 0
                and (c.num_heads * c.head_dim) % 8 == 0 and c.num_heads % c.num_kv_heads == 0)

    def try_forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attention: AttentionBackend,
                    keep: torch.Tensor | None = None,
                    on_launch: Callable[[], None] | None = None) -> torch.Tensor | None:
        """Final-norm hidden states of the step's tokens (only of those `keep` indexes, when
        given: increasing), or None when the backend cannot lay this step out for the kernel.
        `on_launch` is called right before the native call, which runs without the GIL."""
        call = self._arguments(input_ids, positions, attention, keep)
        if call is None:
            return None
        arguments, x, _ = call
        if on_launch is not None:
            on_launch()
        self.kernel(*arguments)
        return x if keep is None else x[:len(keep)]

    def begin(self, input_ids: torch.Tensor, positions: torch.Tensor, attention: AttentionBackend,
              keep: torch.Tensor | None, check_every_macs: int) -> NativeForward | None:
        """The same step run resumably (see NativeForward), or None where try_forward would be."""
        call = self._arguments(input_ids, positions, attention, keep)
        if call is None or self.resumable is None:
            return None
        arguments, x, held = call
        return NativeForward(self.resumable(*arguments, check_every_macs), x, len(x) if keep is None else len(keep),
                             held)

    def _arguments(self, input_ids: torch.Tensor, positions: torch.Tensor, attention: AttentionBackend,
                   keep: torch.Tensor | None) -> tuple[tuple, torch.Tensor, tuple] | None:
        """The kernel's arguments for this step, the tensor it computes in place, and the
        tensors whose memory the arguments point to; None when the backend cannot lay the step
        out for the kernel."""
        paged = attention.paged_step_inputs()
        if paged is None or input_ids.device.type != "cpu":
            return None
        c = self.model.config
        rotary = self.model.rotary.cos_sin
        assert rotary is not None, "the rotary table is built with the model"
        x = self.model.model.embed_tokens(input_ids).contiguous()
        positions = positions.contiguous()
        if keep is not None:
            keep = keep.contiguous()
        rows = len(paged.context_lens)
        decode_only = paged.decode_from == 0
        threads = 1 if decode_only and self.single_threaded_decode else torch.get_num_threads()
        table = self._layer_table(paged)
        arguments = (table.data_ptr(), c.num_layers, self.model.model.norm.weight.data_ptr(),
                     c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size,
                     paged.k_cache.shape[2], c.rms_norm_eps, rows, x.shape[0], paged.decode_from,
                     paged.query_starts.data_ptr(), paged.context_lens.data_ptr(), paged.block_tables.data_ptr(),
                     paged.block_tables.shape[1], rotary.data_ptr(), positions.data_ptr(), paged.slots.data_ptr(),
                     0 if keep is None else keep.data_ptr(), 0 if keep is None else len(keep),
                     0 if paged.item_starts is None else paged.item_starts.data_ptr(),
                     0 if paged.item_lengths is None else paged.item_lengths.data_ptr(), x.data_ptr(), threads)
        return arguments, x, (paged, positions, keep, table)

    def _layer_table(self, paged: PagedStepInputs) -> torch.Tensor:
        """[layers, 23] int64 (LayerWeights), built once per KV cache (the parameters and the
        stored weights never move)."""
        k, v = paged.k_cache.data_ptr(), paged.v_cache.data_ptr()
        if self._pointers is not None and self._pointers[:2] == (k, v):
            return self._pointers[2]
        layer_bytes = paged.k_cache.stride(0) * paged.k_cache.element_size()
        rows = []
        for i, module in enumerate(self.model.model.layers):
            layer = cast(DecoderLayer, module)
            attn = layer.self_attn
            bias = attn.qkv_proj.bias
            row = [layer.input_layernorm.weight.data_ptr(), 0 if bias is None else bias.data_ptr(),
                   0 if attn.q_norm is None else attn.q_norm.weight.data_ptr(),
                   0 if attn.k_norm is None else attn.k_norm.weight.data_ptr(),
                   layer.post_attention_layernorm.weight.data_ptr(), k + i * layer_bytes, v + i * layer_bytes]
            for w in _projections(layer):
                scales = 0 if w.scales is None else w.scales.data_ptr()
                row += [w.data.data_ptr(), scales, FORMATS[w.format][0], w.layout]
            rows.append(row)
        table = torch.tensor(rows, dtype=torch.int64)
        assert table.shape[1] == _WEIGHT_FIELDS
        self._pointers = (k, v, table)
        return table


def _projections(layer: DecoderLayer) -> list[StoredWeight]:
    stored = [linear.stored for linear in layer.projections()]  # LayerWeights' order
    assert all(w is not None for w in stored), "FusedStep.fits takes only layers whose weights are stored"
    return cast(list[StoredWeight], stored)


class NativeSteps(Protocol):
    def advance(self, stop_ptr: int) -> bool: ...


class NativeForward:
    """A step's layers run natively in calls that each stop once the StopFlag is up, between two
    pieces of about its check_every_macs multiply-adds, and go on from there: as fast as one
    call (try_forward) while the flag stays down. Holds every tensor the kernel points to."""

    def __init__(self, steps: NativeSteps, x: torch.Tensor, outputs: int, held: tuple):
        self._steps = steps
        self._x = x
        self._outputs = outputs
        self._held = held

    def advance(self, attention: AttentionBackend, stop: StopFlag) -> torch.Tensor | None:
        """The final-norm hidden states once every layer ran; None when it stopped first."""
        if not self._steps.advance(stop.address):
            return None
        return self._x[:self._outputs]
