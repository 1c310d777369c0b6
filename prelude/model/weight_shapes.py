"""A decoder checkpoint's tensors checked against its config.json before any loader reads them.

Both loaders (model.native_decoder's, and the torch model's) read the tensors they know by name
and skipped the rest, and the native one took whatever shape it found: a config.json whose
sizes disagree with the weights (a Qwen3 config without head_dim, whose default is 128) served
wrong numbers, and biases the model does not apply (Llama's attention_bias puts one on o_proj,
mlp_bias on the MLP's projections) were dropped without a word. transformers refuses the first
("size mismatch") and applies the second; this refuses both, at startup, naming the tensor."""
from __future__ import annotations

import json
import re
from pathlib import Path

from prelude.model.checkpoint_arrays import canonical_name
from prelude.model.config import ModelConfig, UnsupportedModel

_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")


def expected_shapes(config: ModelConfig) -> tuple[dict[str, tuple[int, ...]], dict[str, tuple[int, ...]]]:
    """(the model's tensors outside the layers, one layer's tensors by their name in the layer)."""
    c = config
    q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    layer: dict[str, tuple[int, ...]] = {
        "input_layernorm.weight": (c.hidden_size,), "post_attention_layernorm.weight": (c.hidden_size,),
        "self_attn.q_proj.weight": (q, c.hidden_size), "self_attn.k_proj.weight": (kv, c.hidden_size),
        "self_attn.v_proj.weight": (kv, c.hidden_size), "self_attn.o_proj.weight": (c.hidden_size, q),
        "mlp.gate_proj.weight": (c.intermediate_size, c.hidden_size),
        "mlp.up_proj.weight": (c.intermediate_size, c.hidden_size),
        "mlp.down_proj.weight": (c.hidden_size, c.intermediate_size)}
    if c.attention_bias:
        layer.update({"self_attn.q_proj.bias": (q,), "self_attn.k_proj.bias": (kv,), "self_attn.v_proj.bias": (kv,)})
    if c.qk_norm:
        layer.update({"self_attn.q_norm.weight": (c.head_dim,), "self_attn.k_norm.weight": (c.head_dim,)})
    model = {"model.embed_tokens.weight": (c.vocab_size, c.hidden_size), "model.norm.weight": (c.hidden_size,)}
    if c.head == "ForCausalLM":
        model["lm_head.weight"] = (c.vocab_size, c.hidden_size)
    elif c.head == "ForSequenceClassification":
        model["score.weight"] = (c.num_labels, c.hidden_size)
    return model, layer


def checkpoint_shapes(files: list[Path]) -> dict[str, tuple[int, ...]]:
    """Every tensor's shape, from the safetensors headers alone, under the name the loaders use;
    UnsupportedModel for a file that is no whole safetensors file (cut short, or not one at all:
    the loaders failed on those with a traceback, or a MemoryError reading a header whose length
    came from garbage)."""
    shapes = {}
    for path in files:
        header = _header(path)
        for name, meta in header.items():
            if name != "__metadata__":
                shapes[canonical_name(name)] = tuple(meta["shape"])
    return shapes


def _header(path: Path) -> dict:
    size = path.stat().st_size
    with open(path, "rb") as f:
        length = int.from_bytes(f.read(8), "little")
        try:
            if not 2 <= length <= size - 8:
                raise ValueError(f"its header length {length} does not fit the file's {size} bytes")
            header = json.loads(f.read(length))
            end = max((meta["data_offsets"][1] for name, meta in header.items() if name != "__metadata__"),
                      default=0)
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            raise UnsupportedModel(f"{path} is not a readable safetensors file ({exc})") from None
    if 8 + length + end > size:
        raise UnsupportedModel(f"{path} is cut short: its tensors need {8 + length + end} bytes, the file has {size}")
    return header


def check_decoder_checkpoint(config: ModelConfig, files: list[Path]) -> None:
    """Raises UnsupportedModel for a file that is no whole safetensors file (any model), and for
    a decoder's tensor whose shape config.json contradicts or a bias it would not apply."""
    shapes = checkpoint_shapes(files)
    if config.encoder is not None or config.int8_weights:
        return  # other names; an int8 checkpoint's tensors are its own (model.quantized_checkpoint)
    model, layer = expected_shapes(config)
    for name, shape in sorted(shapes.items()):  # the first layer's mismatch is named
        match = _LAYER.match(name)
        expected = layer.get(match.group(2)) if match else model.get(name)
        if expected is None:
            if name.endswith(".bias"):
                raise UnsupportedModel(f"the checkpoint has {name}, a bias this server does not apply to "
                                       f"{config.architecture} (config.json: attention_bias "
                                       f"{config.attention_bias}); serving without it would give other numbers")
            continue
        if shape != expected:
            raise UnsupportedModel(f"the checkpoint's {name} is {list(shape)}, where config.json's sizes make it "
                                   f"{list(expected)} (hidden_size, intermediate_size, num_attention_heads, "
                                   "num_key_value_heads, head_dim, vocab_size)")
    wanted = set(model) | {f"model.layers.{i}.{name}" for i in range(config.num_layers) for name in layer}
    if config.tie_word_embeddings:
        wanted.discard("lm_head.weight")  # the embedding's
    missing = sorted(wanted - shapes.keys())
    if missing:  # named as the checkpoint names them (the loaders named their fused parameters)
        raise UnsupportedModel(f"the checkpoint lacks {', '.join(missing[:4])}"
                               f"{f' and {len(missing) - 4} more' if len(missing) > 4 else ''}")

