"""A compressed-tensors int8 checkpoint (llm-compressor's W8A8 / W8A16: int8 `weight` beside a
per-channel `weight_scale`) loads without a flag, is stored in int8 on the CPU with the
checkpoint's own codes, and computes what the same weights computed from an unquantized
checkpoint with `--quantization int8`; other quantization configs are refused with a reason."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from kernels.cpu import ops as cpu_ops
from prelude.model.config import ModelConfig, UnsupportedModel
from prelude.model.cpu_linear import dequantized
from prelude.model.loader import cpu_weight_format, load_model
from prelude.model.ops import select_ops
from tests.checkpoints import make_checkpoint

pytestmark = pytest.mark.skipif(not cpu_ops.built, reason="kernels.cpu is not built")

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
COMPRESSED_TENSORS = {
    "quant_method": "compressed-tensors", "format": "int-quantized", "ignore": ["lm_head"],
    "config_groups": {"group_0": {
        "targets": ["Linear"],
        "weights": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel", "dynamic": False},
        "input_activations": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token", "dynamic": True},
    }},
}


def _quantized_pair(tmp_path):
    """(an int8 checkpoint, an unquantized one holding the same weights: codes times scales)."""
    source = make_checkpoint(tmp_path / "source", "qwen3", hidden_size=256, intermediate_size=512)
    tensors = load_file(source / "model.safetensors")
    quantized, widened = {}, {}
    for name, tensor in tensors.items():
        if any(f".{p}.weight" in name for p in PROJECTIONS):
            scale = (tensor.abs().amax(dim=1, keepdim=True) / 127).to(torch.bfloat16)  # as llm-compressor saves it
            codes = (tensor / scale.float()).round().clamp(-127, 127).to(torch.int8)
            quantized[name], quantized[name + "_scale"] = codes, scale
            widened[name] = codes.float() * scale.float()
        else:
            quantized[name] = widened[name] = tensor
    config = json.loads((source / "config.json").read_text())
    paths = []
    for label, weights, extra in (("int8", quantized, {"quantization_config": COMPRESSED_TENSORS}),
                                  ("widened", widened, {})):
        path = tmp_path / label
        path.mkdir()
        (path / "config.json").write_text(json.dumps({**config, **extra}))
        save_file(weights, str(path / "model.safetensors"))
        paths.append(path)
    return paths


def test_an_int8_checkpoint_is_served_in_int8_with_its_own_codes(tmp_path):
    int8_path, widened_path = _quantized_pair(tmp_path)
    config = ModelConfig.from_dir(int8_path)
    assert config.int8_weights
    assert cpu_weight_format(torch.float32, "none", config) == (torch.float32, "int8")  # no flag needed
    ops = select_ops(torch.device("cpu"))
    models = [load_model(path, ModelConfig.from_dir(path), torch.float32, torch.device("cpu"), max_positions=64,
                         ops=ops, weight_format="int8") for path in (int8_path, widened_path)]
    for ours, reference in zip(*(m.model.layers for m in models)):
        for a, b in zip(ours.projections(), reference.projections()):
            assert a.stored is not None and b.stored is not None
            assert torch.equal(a.stored.data, b.stored.data)
    # The checkpoint's own codes and scales: what is stored widens back to codes x scales.
    widened = load_file(widened_path / "model.safetensors")
    down = models[0].model.layers[0].mlp.down_proj.stored
    assert down is not None
    torch.testing.assert_close(dequantized(down), widened["model.layers.0.mlp.down_proj.weight"], rtol=1e-6, atol=1e-7)
    ids = torch.arange(3, 40)
    with torch.inference_mode():
        states = [m.model.embed_tokens(ids) for m in models]
        outs = [m.model.layers[0].mlp(s) for m, s in zip(models, states)]
    torch.testing.assert_close(outs[0], outs[1])


@pytest.mark.parametrize("quantization", [{"quant_method": "awq", "bits": 4},
                                          {**COMPRESSED_TENSORS, "format": "pack-quantized"}])
def test_other_quantized_checkpoints_are_refused_with_the_reason(quantization):
    raw = {"architectures": ["Qwen3ForCausalLM"], "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
           "num_hidden_layers": 1, "num_attention_heads": 2, "quantization_config": quantization}
    with pytest.raises(UnsupportedModel, match="compressed-tensors int-quantized 8-bit"):
        ModelConfig.from_dict(raw)
