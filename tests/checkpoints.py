"""Tiny random-weight checkpoints in the exact HF layout, written by `transformers` itself."""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Callable

import torch

TINY = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
)


# Architecture name prefix of each family.
PREFIXES = {"qwen3": "Qwen3", "qwen2": "Qwen2", "llama": "Llama", "bert": "Bert", "xlm-roberta": "XLMRoberta",
            "modernbert": "ModernBert"}


def hf_config(family: str, vocab_size: int = 512, tie: bool = False, head: str = "ForCausalLM", **extra):
    import transformers

    cls = {"qwen3": transformers.Qwen3Config, "qwen2": transformers.Qwen2Config,
           "llama": transformers.LlamaConfig, "bert": transformers.BertConfig,
           "xlm-roberta": transformers.XLMRobertaConfig, "modernbert": transformers.ModernBertConfig}[family]
    kwargs = dict(TINY, vocab_size=vocab_size, tie_word_embeddings=tie, **extra)
    if family == "qwen3":
        kwargs.setdefault("head_dim", 16)
    if family == "modernbert":  # its default special ids lie past a tiny vocabulary
        kwargs.update(pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2)
    prefix = PREFIXES[family]
    config = cls(**kwargs)
    config.architectures = [prefix + head]
    return config


def make_checkpoint(path: Path, family: str, seed: int = 0, vocab_size: int = 512, tie: bool = False,
                    head: str = "ForCausalLM", max_shard_size: str | None = None, dtype: torch.dtype | None = None,
                    **extra) -> Path:
    """Writes config.json + safetensors for a random model and returns the directory; `dtype`:
    the weights saved in it (bf16, as most published checkpoints are), else fp32."""
    import transformers

    config = hf_config(family, vocab_size, tie, head, **extra)
    torch.manual_seed(seed)
    model_cls = getattr(transformers, config.architectures[0])
    model = model_cls(config).eval()
    # Random init leaves norms at 1.0; perturb them so q/k-norm and final-norm bugs show.
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.add_(torch.randn_like(param) * 0.1)
    if dtype is not None:
        model = model.to(dtype)
    path.mkdir(parents=True, exist_ok=True)
    save_kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(path, **save_kwargs)
    return path


def make_model_dir(path: Path, family: str, tokenizer_from: Path, head: str = "ForCausalLM",
                   seed: int = 0, **extra) -> Path:
    """A complete model directory: random weights sized to the tokenizer copied from
    `tokenizer_from` (tokenizer.json, tokenizer_config.json)."""
    import shutil

    from tokenizers import Tokenizer

    vocab = Tokenizer.from_file(str(tokenizer_from / "tokenizer.json")).get_vocab_size(with_added_tokens=True)
    make_checkpoint(path, family, seed=seed, vocab_size=vocab, head=head, **extra)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if (tokenizer_from / name).is_file():
            shutil.copy(tokenizer_from / name, path / name)
    return path


def load_reference(path: Path):
    import transformers

    config = transformers.AutoConfig.from_pretrained(path)
    model_cls = getattr(transformers, config.architectures[0])
    return model_cls.from_pretrained(path, dtype=torch.float32).eval()


def edited_copy(model_dir: Path, path: Path, filename: str, edit: Callable[[dict], None]) -> Path:
    """A copy of model_dir at path whose JSON file `filename` went through edit (in place)."""
    for item in model_dir.iterdir():
        shutil.copy(item, path / item.name)
    target = path / filename
    content = json.loads(target.read_text(encoding="utf-8")) if target.is_file() else {}
    edit(content)
    target.write_text(json.dumps(content), encoding="utf-8")
    return path
