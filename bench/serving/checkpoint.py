"""Random-weight Qwen3 checkpoints in exact Hugging Face layout (config.json, model.safetensors
under the HF tensor names, the tokenizer files), so any HF-format server (Prelude, vLLM, SGLang)
loads the same bytes. Used by gpu_table2 (0.6B, 4B), multi_item and the side-by-side CPU bench
(103M: checkpoint B of issue #20).

    python -m bench.serving.checkpoint --size 103M --dtype float32 \
        --tokenizer ../shared/tokenizers/qwen3 /tmp/qwen3-103M
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Sequence

SIZES = {  # the published Qwen3 configs, less what they share (COMMON)
    "0.6B": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16),
    "4B": dict(hidden_size=2560, intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32),
    # Issue #20's checkpoint B: small enough for a 2-core CPU, yet its LM head over the real
    # 151,936-token vocabulary dominates decode as it does in real small models (103 M params,
    # 78 M of them the tied embedding).
    "103M": dict(hidden_size=512, intermediate_size=1536, num_hidden_layers=8, num_attention_heads=8,
                 num_key_value_heads=4, head_dim=64),
    # A smoke test of the scripts on a CPU machine.
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=2),
}
COMMON = dict(
    architectures=["Qwen3ForCausalLM"], model_type="qwen3", num_key_value_heads=8, head_dim=128,
    vocab_size=151936, tie_word_embeddings=True, rope_theta=1000000.0, max_position_embeddings=40960,
    rms_norm_eps=1e-6, hidden_act="silu", attention_bias=False, torch_dtype="bfloat16",
    bos_token_id=151643, eos_token_id=151645,
)
DTYPES = ("bfloat16", "float16", "float32")


def write_checkpoint(target: Path, size: str, tokenizer: Path | None, seed: int = 0,
                     dtype: str = "bfloat16") -> Path:
    """Random weights (std 0.02, norms at 1) in `dtype` under the HF names, config.json (its
    torch_dtype saying `dtype`, which servers load by default), and the tokenizer files of
    `tokenizer` (a folder), else the demo tokenizer."""
    import torch
    from safetensors.torch import save_file

    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    config = dict(COMMON, **SIZES[size], torch_dtype=dtype)
    target.mkdir(parents=True, exist_ok=True)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator(device).manual_seed(seed)
    h, inter, hd = config["hidden_size"], config["intermediate_size"], config["head_dim"]
    q, kv = config["num_attention_heads"] * hd, config["num_key_value_heads"] * hd
    store = getattr(torch, dtype)

    def rand(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen, device=device) * 0.02).to(store).cpu()

    def ones(n: int) -> torch.Tensor:
        return torch.ones(n, dtype=store)

    tensors = {"model.embed_tokens.weight": rand(config["vocab_size"], h), "model.norm.weight": ones(h)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        tensors.update({
            p + "input_layernorm.weight": ones(h), p + "post_attention_layernorm.weight": ones(h),
            p + "self_attn.q_proj.weight": rand(q, h), p + "self_attn.k_proj.weight": rand(kv, h),
            p + "self_attn.v_proj.weight": rand(kv, h), p + "self_attn.o_proj.weight": rand(h, q),
            p + "self_attn.q_norm.weight": ones(hd), p + "self_attn.k_norm.weight": ones(hd),
            p + "mlp.gate_proj.weight": rand(inter, h), p + "mlp.up_proj.weight": rand(inter, h),
            p + "mlp.down_proj.weight": rand(h, inter),
        })
    save_file(tensors, str(target / "model.safetensors"), metadata={"format": "pt"})
    (target / "config.json").write_text(json.dumps(config, indent=1))
    source = tokenizer if tokenizer is not None and (tokenizer / "tokenizer.json").is_file() else None
    if source is None:  # the demo tokenizer: outputs are then not Qwen3 text, timings still are
        from prelude.demo import build_demo_model

        source = Path(tempfile.mkdtemp()) / "demo"
        build_demo_model(source)
        print(f"[{size}] no tokenizer at {tokenizer}: using the demo tokenizer", flush=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if (source / name).is_file():
            shutil.copy(source / name, target / name)
    return target


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.serving.checkpoint", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("target", type=Path, help="folder to write")
    p.add_argument("--size", choices=sorted(SIZES), default="103M")
    p.add_argument("--dtype", choices=DTYPES, default="float32")
    p.add_argument("--tokenizer", type=Path, help="folder with tokenizer.json (default: the demo tokenizer)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    print(write_checkpoint(args.target, args.size, args.tokenizer, args.seed, args.dtype))
    return 0


if __name__ == "__main__":
    sys.exit(main())
