"""A decode step's decoder layers in one native call on the CPU (kernels/cpu/decode_layers.hpp).

A decode step of a small model on the CPU is mostly overhead: per layer a dozen torch dispatches,
tensor allocations and GIL hand-offs, each costing more than the few rows of arithmetic behind
it (the demo model's 4-row step spent two thirds of its time holding the GIL). This runs the
same kernels the per-op path calls, for every layer and the final norm, in one call without the
GIL. It takes only what it was written for: fp32 on the CPU, a step of decode rows only whose
backend exposes its paged cache (AttentionBackend.paged_decode_inputs), and sizes the vector
kernels take; every other step runs layer by layer."""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, cast

import torch
import torch.nn.functional as F

from prelude.model.attention import AttentionBackend, PagedDecodeInputs

if TYPE_CHECKING:
    from prelude.model.decoder import DecoderLM, DecoderLayer

DecodeKernel = Callable[..., None]  # kernels/cpu/_native.pyi: decode_step

# DecodeLayerWeights' eleven pointers, in their order.
_WEIGHT_FIELDS = 11
# A model whose layers hold fewer weights than this decodes on one thread: a second one buys
# little on so few weights and takes the core the event loop streams tokens from. On the demo
# model (786K per layer) one thread gave 4-12% lower TPOT and CPU per request in the server than
# two (two side-by-side runs); the 103M Qwen3 (3.1M per layer) needs both for its bandwidth.
_ONE_THREAD_LAYER_WEIGHTS = 1 << 21


class FusedDecode:
    """Binds a loaded model's parameters to the native decode kernel."""

    def __init__(self, model: DecoderLM, kernel: DecodeKernel):
        self.model = model
        self.kernel = kernel
        self._pointers: tuple[int, int, torch.Tensor] | None = None  # (k ptr, v ptr, table)
        layer_weights = sum(p.numel() for p in model.model.layers[0].parameters()) if len(model.model.layers) else 0
        self.single_threaded = layer_weights < _ONE_THREAD_LAYER_WEIGHTS

    @staticmethod
    def fits(model: DecoderLM) -> bool:
        """The model's parameters and sizes are ones the kernel takes."""
        c = model.config
        params = list(model.parameters())
        return (all(p.dtype == torch.float32 and p.device.type == "cpu" and p.is_contiguous() for p in params)
                and c.hidden_size % 8 == 0 and c.intermediate_size % 8 == 0 and c.head_dim % 16 == 0
                and (c.num_heads * c.head_dim) % 8 == 0 and c.num_heads % c.num_kv_heads == 0)

    def try_forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attention: AttentionBackend,
                    on_launch: Callable[[], None] | None = None) -> torch.Tensor | None:
        """Final-norm hidden states of a decode-only step, or None when this step is not one.
        `on_launch` is called right before the native call, which runs without the GIL."""
        paged = attention.paged_decode_inputs()
        if paged is None or input_ids.device.type != "cpu":
            return None
        c = self.model.config
        rotary = self.model.rotary.cos_sin
        assert rotary is not None, "the rotary table is built with the model"
        x = F.embedding(input_ids, self.model.model.embed_tokens.weight).contiguous()
        positions = positions.contiguous()
        rows = x.shape[0]
        if on_launch is not None:
            on_launch()
        self.kernel(self._layer_table(paged).data_ptr(), c.num_layers, self.model.model.norm.weight.data_ptr(),
                    c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size,
                    paged.k_cache.shape[2], c.rms_norm_eps, rows, rotary.data_ptr(), positions.data_ptr(),
                    paged.slots.data_ptr(), paged.block_tables.data_ptr(), paged.block_tables.shape[1],
                    paged.context_lens.data_ptr(), x.data_ptr(), 1 if self.single_threaded else torch.get_num_threads())
        return x

    def _layer_table(self, paged: PagedDecodeInputs) -> torch.Tensor:
        """[layers, 11] int64 pointers, built once per KV cache (the parameters never move)."""
        k, v = paged.k_cache.data_ptr(), paged.v_cache.data_ptr()
        if self._pointers is not None and self._pointers[:2] == (k, v):
            return self._pointers[2]
        layer_bytes = paged.k_cache.stride(0) * paged.k_cache.element_size()
        rows = []
        for i, module in enumerate(self.model.model.layers):
            layer = cast("DecoderLayer", module)
            attn, mlp = layer.self_attn, layer.mlp
            bias = attn.qkv_proj.bias
            rows.append([layer.input_layernorm.weight.data_ptr(), attn.qkv_proj.weight.data_ptr(),
                         0 if bias is None else bias.data_ptr(),
                         0 if attn.q_norm is None else attn.q_norm.weight.data_ptr(),
                         0 if attn.k_norm is None else attn.k_norm.weight.data_ptr(),
                         attn.o_proj.weight.data_ptr(), layer.post_attention_layernorm.weight.data_ptr(),
                         mlp.gate_up_proj.weight.data_ptr(), mlp.down_proj.weight.data_ptr(),
                         k + i * layer_bytes, v + i * layer_bytes])
        table = torch.tensor(rows, dtype=torch.int64)
        assert table.shape[1] == _WEIGHT_FIELDS
        self._pointers = (k, v, table)
        return table
