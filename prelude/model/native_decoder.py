"""A decoder's weights as the CPU's native kernels keep them, and its step's layers in one native
call, without torch: the checkpoint is read from its memory map into numpy arrays the kernels
point to (kernels/cpu/_native), and nothing here imports torch.

It holds what executor.fused_step binds from a loaded DecoderLM, in the same formats and layouts
(model.cpu_linear's), so the two run the same kernels on the same bytes: the layers' projections
packed into panels (q/k/v and gate/up fused, as DecoderLM fuses them), the embedding (which a
tied head multiplies by) in the head's layout, the norms in fp32, the rotary table."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Protocol

import numpy as np

from kernels.cpu.addresses import address_of
from prelude.model.checkpoint_arrays import BF16_SOURCE, Checkpoint, NotNative, Source, fp32
from prelude.model.config import ModelConfig
from prelude.model.rotary import rotary_table
from prelude.model.weight_formats import BY_ROWS, CODES, HEAD_LAYOUTS, PANELS, placement, storable_shape

try:
    from kernels.cpu import _native
except ImportError:  # the extension is not built (a source checkout before `pip install -e .`)
    _native = None  # type: ignore[assignment]

# The kernels' weight format codes (weight_formats.CODES).
FLOAT32, BFLOAT16, INT8, BF16X3, BF16X2 = (CODES[name] for name in ("float32", "bfloat16", "int8", "bf16x3",
                                                                      "bf16x2"))
_BYTES = {FLOAT32: 4, BFLOAT16: 2, INT8: 1, BF16X3: 4, BF16X2: 2}
# A model whose layers hold fewer weights than this decodes on one thread: a second one buys
# little on so few weights (the demo model's) and takes the core the event loop streams tokens
# from, while larger layers need both for their bandwidth (TPOT and CPU per request:
# `python -m bench.serving.side_by_side`). Steps with prompt rows are compute-bound and always
# use every thread.
ONE_THREAD_LAYER_WEIGHTS = 1 << 21


@dataclass(frozen=True, slots=True)
class NativeWeight:
    """An [outputs, inputs] weight as the kernels read it (kernels/cpu/weights.hpp)."""

    data: np.ndarray
    scales: np.ndarray | None
    format: int
    layout: int
    outputs: int
    inputs: int
    # The arrays' addresses, taken once: a step reads them several times.
    address: int = field(init=False)
    scales_address: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "address", address_of(self.data))
        object.__setattr__(self, "scales_address", address_of(self.scales))

    def matmul(self, x: np.ndarray, threads: int) -> np.ndarray:
        """x [rows, inputs] fp32 contiguous times the weight transposed: [rows, outputs] fp32."""
        out = np.empty((x.shape[0], self.outputs), np.float32)
        _native.matmul(address_of(x), x.shape[0], self.address, self.scales_address, self.format, self.layout,
                       self.inputs, address_of(out), self.outputs, threads)
        return out

    def rows(self, ids: np.ndarray) -> np.ndarray:
        """Rows `ids` (int64, contiguous) widened to fp32: an embedding lookup (IndexError for an id
        outside the weight's rows)."""
        out = np.empty((len(ids), self.inputs), np.float32)
        format = BFLOAT16 if self.format == BF16X2 else self.format  # its one packing is bf16's
        _native.rows_of(self.address, self.scales_address, format, self.inputs, self.outputs, address_of(ids), len(ids),
                        address_of(out), self.layout)
        return out


def store(source: Source, format: int, layout: int, threads: int) -> NativeWeight:
    """A checkpoint tensor (fp32 or bf16) in `format` and `layout`, as model.cpu_linear.store."""
    outputs, inputs = source.shape
    array = np.ascontiguousarray(source.array)
    pack_format = BFLOAT16 if format in (BF16X2, BF16X3) else format
    scales = None
    if format == BF16X3:
        size = _native.packed_size(outputs, inputs) * 2
        data = np.empty(2 * size, np.uint8)
        rest = array - bf16_rounded(array)  # what bf16 leaves of each weight, packed in bf16 again
        for half, part in enumerate((array, rest)):
            _native.pack_linear(address_of(part), outputs, inputs, BFLOAT16, address_of(data[half * size:]), 0,
                                threads, 0)
        return NativeWeight(data, None, format, layout, outputs, inputs)
    if layout == PANELS:
        data = np.empty(_native.packed_size(outputs, inputs) * _BYTES[format], np.uint8)
        if format == INT8:
            scales = np.empty(_native.scales_size(outputs), np.float32)
        _native.pack_linear(address_of(array), outputs, inputs, pack_format, address_of(data),
                            address_of(scales), threads, source.code)
    else:
        data = np.empty(outputs * inputs * _BYTES[format], np.uint8)
        if format == INT8:
            scales = np.empty(outputs, np.float32)
        _native.convert_weight(address_of(array), outputs, inputs, pack_format, address_of(data),
                               address_of(scales), threads, source.code)
    return NativeWeight(data, scales, format, layout, outputs, inputs)


def _stored(source: Source, format: str, head: bool, threads: int) -> NativeWeight:
    """A weight kept where weight_formats.placement puts it (model.layers' choice): a layer's in
    panels, a head in its format's layout; fp32 by rows where it would stay as loaded."""
    layout = HEAD_LAYOUTS.get(format, BY_ROWS) if head else PANELS
    placed = placement(format, layout, source.code == BF16_SOURCE, source.shape[1])
    if placed is None and head and storable_shape("float32", BY_ROWS, source.shape[1]):
        placed = ("float32", BY_ROWS)
    if placed is None:  # the torch model keeps it as loaded, and runs its layers op by op
        raise NotNative(f"a weight of {source.shape[1]} columns the kernels do not take in {format}")
    return store(source, CODES[placed[0]], placed[1], threads)


def bf16_rounded(weight: np.ndarray) -> np.ndarray:
    """fp32 values rounded to bf16's (to nearest, ties to even, as torch converts), in fp32."""
    bits = weight.view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).astype(np.uint32).view(np.float32)


class ResumableForward(Protocol):
    """kernels/cpu/_native.pyi's ResumableStep."""

    def advance(self, stop_ptr: int) -> bool: ...


@dataclass(frozen=True, slots=True)
class NativeLayer:
    input_norm: np.ndarray
    qkv_bias: np.ndarray | None
    q_norm: np.ndarray | None
    k_norm: np.ndarray | None
    post_norm: np.ndarray
    projections: tuple[NativeWeight, NativeWeight, NativeWeight, NativeWeight]  # qkv, o, gate/up, down


class NativeDecoder:
    """A *ForCausalLM or *Model decoder (Qwen3, Qwen2, Llama) on the native kernels."""

    def __init__(self, config: ModelConfig, layers: list[NativeLayer], embedding: NativeWeight,
                 head: NativeWeight | None, final_norm: np.ndarray, rotary: np.ndarray):
        self.config = config
        self.layers = layers
        self.embedding = embedding
        self.head = head
        self.final_norm = final_norm
        self.rotary = rotary
        self.final_norm_address, self.rotary_address = address_of(final_norm), address_of(rotary)
        layer_weights = sum(w.outputs * w.inputs for w in layers[0].projections) if layers else 0
        self.single_threaded_decode = layer_weights < ONE_THREAD_LAYER_WEIGHTS

    @staticmethod
    def check(config: ModelConfig, format: str | None) -> None:
        """Raises NotNative unless this runs the config in `format` (loader.cpu_weight_format's)."""
        if config.encoder is not None or config.head not in ("ForCausalLM", "Model"):
            raise NotNative(f"{config.architecture}: only causal-LM and embedding decoders")
        if _native is None:
            raise NotNative("the native kernels are not built")
        if config.int8_weights or format not in CODES or format == "bf16x2":
            raise NotNative(f"weights stored {format}")
        c = config
        if not (c.hidden_size % 8 == 0 and c.intermediate_size % 8 == 0 and c.head_dim % 16 == 0
                and (c.num_heads * c.head_dim) % 8 == 0 and c.num_heads % c.num_kv_heads == 0):
            raise NotNative("sizes the native step does not take")  # executor.fused_step's

    @classmethod
    def load(cls, files: list[Path], config: ModelConfig, format: str | None, max_positions: int,
             threads: int) -> NativeDecoder:
        cls.check(config, format)
        assert format is not None
        checkpoint = Checkpoint(files)
        try:
            layers = [cls._layer(checkpoint, config, i, format, threads) for i in range(config.num_layers)]
            embedding = _stored(checkpoint["model.embed_tokens.weight"], format, True, threads)
            head = None  # the embedding's (tied, or an embedding checkpoint's)
            if config.head == "ForCausalLM" and not config.tie_word_embeddings:
                head = _stored(checkpoint["lm_head.weight"], format, True, threads)
            final_norm = fp32(checkpoint["model.norm.weight"])
        finally:
            checkpoint.close()
        return cls(config, layers, embedding, head, final_norm, rotary_table(config.rope, config.head_dim,
                                                                                 max_positions))

    @staticmethod
    def _layer(checkpoint: Checkpoint, config: ModelConfig, i: int, format: str, threads: int) -> NativeLayer:
        p = f"model.layers.{i}."
        a, m = p + "self_attn.", p + "mlp."

        def packed(source: Source) -> NativeWeight:
            return _stored(source, format, False, threads)

        bias = None
        if config.attention_bias:
            bias = fp32(checkpoint.fused(a + "q_proj.bias", a + "k_proj.bias", a + "v_proj.bias"))
        return NativeLayer(
            fp32(checkpoint[p + "input_layernorm.weight"]), bias,
            fp32(checkpoint[a + "q_norm.weight"]) if config.qk_norm else None,
            fp32(checkpoint[a + "k_norm.weight"]) if config.qk_norm else None,
            fp32(checkpoint[p + "post_attention_layernorm.weight"]),
            (packed(checkpoint.fused(a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight")),
             packed(checkpoint[a + "o_proj.weight"]),
             packed(checkpoint.fused(m + "gate_proj.weight", m + "up_proj.weight")),
             packed(checkpoint[m + "down_proj.weight"])))

    def forward(self, arguments: tuple) -> None:
        """The step's layers and final norm over its embeddings, in place (arguments:
        kernels/cpu/_native.pyi's forward_step)."""
        _native.forward_step(*arguments)

    def begin(self, arguments: tuple, check_every_macs: int) -> ResumableForward:
        """forward() run resumably, in calls that stop when a flag is up."""
        resumable: Callable[..., ResumableForward] = _native.ResumableStep
        return resumable(*arguments, check_every_macs)

    @property
    def lm_head(self) -> NativeWeight:
        """The weight the LM head multiplies by: its own, else the embedding (tied, or an
        embedding checkpoint's, as DecoderLM.compute_logits)."""
        return self.embedding if self.head is None else self.head

    def layer_table(self, k_cache: np.ndarray, v_cache: np.ndarray) -> np.ndarray:
        """[layers, 23] int64 (kernels/cpu/step_layers.hpp's LayerWeights) over this KV cache."""
        k, v, layer_bytes = address_of(k_cache), address_of(v_cache), k_cache.strides[0]
        rows = []
        for i, layer in enumerate(self.layers):
            row = [address_of(layer.input_norm), address_of(layer.qkv_bias), address_of(layer.q_norm),
                   address_of(layer.k_norm), address_of(layer.post_norm), k + i * layer_bytes, v + i * layer_bytes]
            for w in layer.projections:
                row += [w.address, w.scales_address, w.format, w.layout]
            rows.append(row)
        return np.array(rows, np.int64).reshape(len(rows), 23)

    @property
    def formats(self) -> list[str]:
        """The formats the weights are kept in (model.layers.stored_formats' names)."""
        names = {FLOAT32: "float32", BFLOAT16: "bfloat16", INT8: "int8", BF16X3: "bf16x3", BF16X2: "bf16x2"}
        weights = [w for layer in self.layers for w in layer.projections] + [self.embedding]
        return sorted({names[w.format] for w in weights})

    @property
    def nbytes(self) -> int:
        weights = [w for layer in self.layers for w in layer.projections] + [self.embedding]
        if self.head is not None and self.head is not self.embedding:
            weights.append(self.head)
        return sum(w.data.nbytes + (0 if w.scales is None else w.scales.nbytes) for w in weights)

