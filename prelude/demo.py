"""The embedded demo model: a tiny Qwen3-architecture checkpoint with deterministic random
weights and a byte-level BPE tokenizer trained here, deterministically, on generated text.

It exists so that `python -m prelude` serves something with no download. Its outputs are
meaningless. Built on first use into a cache folder and reused afterwards.
"""
from __future__ import annotations

import json
import logging
import random
import shutil
import tempfile
from pathlib import Path

from prelude.cachedir import cache_root

logger = logging.getLogger(__name__)

VERSION = "2"
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
VOCAB_SIZE = 2048
# Qwen2/Qwen3's pre-tokenizer pattern, so the demo exercises the same tokenizer code path.
SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
MODEL_CONFIG = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 256,
    "intermediate_size": 768,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 32,
    "hidden_act": "silu",
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": True,
    "attention_bias": False,
    "torch_dtype": "bfloat16",
    "vocab_size": VOCAB_SIZE,
}

_WORDS = (
    "the of and to in is that it for as was with be by on not he this are or his from at which "
    "but have an they you were her she there been one all we their has would when if so no "
    "model token request server prompt judge score reward label answer question policy route "
    "decode prefill cache block batch latency throughput memory tensor kernel graph stream "
    "yes maybe true false good bad safe unsafe relevant document query user assistant system "
    "time year people way day man thing woman life child world school state family student "
    "group country problem hand part place case week company number night point home water "
    "room mother area money story fact month lot right study book eye job word business issue"
).split()
_CODE = [
    "def f(x):\n    return x * 2\n",
    "for i in range(10):\n\tprint(i)\n",
    "if (a && b) { return c[i]; }\n",
    "import json\nvalue = json.loads(text)\n",
    "SELECT id, name FROM users WHERE age > 30;\n",
]
_OTHER = ["naïve café", "Größe", "你好世界", "こんにちは", "Привет мир", "مرحبا", "😀 🎉", "1234567890",
          "3.14159", "-".join(("2026", "11", "21")), "e-mail", "don't", "it's", "we'll", "they're"]


_SYLLABLES = [c + v for c in "bcdfghjklmnprstvwz" for v in ("a", "e", "i", "o", "u", "ai", "ou")]


def _corpus(seed: int = 20261121, sentences: int = 6000) -> list[str]:
    rng = random.Random(seed)
    # Invented words give the trainer enough distinct pairs to fill the vocabulary.
    invented = ["".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 4))) for _ in range(3000)]
    lines = []
    for _ in range(sentences):
        words = [rng.choice(_WORDS if rng.random() < 0.6 else invented) for _ in range(rng.randint(4, 16))]
        if rng.random() < 0.3:
            words.insert(rng.randrange(len(words)), rng.choice(_OTHER))
        sentence = " ".join(words).capitalize() + rng.choice([".", "?", "!", ",", ":"])
        if rng.random() < 0.1:
            sentence += "\n" + rng.choice(_CODE)
        if rng.random() < 0.2:  # bare answers, so "yes" and "no" are single tokens (judge prompts)
            sentence += "\n" + rng.choice(("yes", "no"))
        lines.append(sentence)
    return lines


def _train_tokenizer(path: Path) -> None:
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE, special_tokens=SPECIAL_TOKENS, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(_corpus(), trainer=trainer)
    tokenizer.save(str(path))


def _write_weights(path: Path, config: dict, seed: int = 0) -> None:
    import torch
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(seed)
    h, i, v = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    q = config["num_attention_heads"] * config["head_dim"]
    kv = config["num_key_value_heads"] * config["head_dim"]
    shapes = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,)}
    for n in range(config["num_hidden_layers"]):
        p = f"model.layers.{n}."
        shapes |= {
            p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (q, h), p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, q),
            p + "self_attn.q_norm.weight": (config["head_dim"],),
            p + "self_attn.k_norm.weight": (config["head_dim"],),
            p + "mlp.gate_proj.weight": (i, h), p + "mlp.up_proj.weight": (i, h),
            p + "mlp.down_proj.weight": (h, i),
        }
    tensors = {}
    for name, shape in shapes.items():
        if name.endswith("norm.weight"):
            tensors[name] = torch.ones(shape, dtype=torch.bfloat16)
        else:
            tensors[name] = (torch.randn(shape, generator=gen) * 0.05).to(torch.bfloat16)
    save_file(tensors, str(path), metadata={"format": "pt"})


def build_demo_model(target: Path) -> None:
    target.mkdir(parents=True, exist_ok=True)
    _train_tokenizer(target / "tokenizer.json")
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(target / "tokenizer.json"))
    ids = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}
    config = dict(MODEL_CONFIG, vocab_size=tok.get_vocab_size(),
                  bos_token_id=None, eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"])
    (target / "config.json").write_text(json.dumps(config, indent=2))
    (target / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]]}, indent=2))
    (target / "tokenizer_config.json").write_text(json.dumps({
        "added_tokens_decoder": {str(ids[t]): {"content": t, "special": True} for t in SPECIAL_TOKENS},
        "bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
        "chat_template": CHAT_TEMPLATE, "model_max_length": MODEL_CONFIG["max_position_embeddings"],
    }, indent=2))
    _write_weights(target / "model.safetensors", config)


CLASSIFIER_LABELS = {"0": "negative", "1": "positive"}


def build_demo_classifier(lm_dir: Path, target: Path, seed: int = 1) -> None:
    """The demo model's classifier variant: the same decoder and tokenizer with a two-label
    sequence-classification head (random, like the rest), for /classify and cross-encoder
    /score and /rerank."""
    import torch
    from safetensors.torch import load_file, save_file

    target.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(lm_dir / name, target / name)
    config = json.loads((lm_dir / "config.json").read_text())
    config.update(architectures=["Qwen3ForSequenceClassification"], id2label=CLASSIFIER_LABELS,
                  label2id={v: int(k) for k, v in CLASSIFIER_LABELS.items()})
    (target / "config.json").write_text(json.dumps(config, indent=2))
    tensors = load_file(str(lm_dir / "model.safetensors"))
    gen = torch.Generator().manual_seed(seed)
    tensors["score.weight"] = (torch.randn((len(CLASSIFIER_LABELS), config["hidden_size"]), generator=gen)
                               * 0.05).to(torch.bfloat16)
    save_file(tensors, str(target / "model.safetensors"), metadata={"format": "pt"})


def _ensure(target: Path, build) -> Path:
    """`target`, built by `build(dir)` on first use (atomically: a concurrent first start either
    builds its own copy or sees a complete one)."""
    if (target / "model.safetensors").is_file():
        return target
    logger.info("building %s (first use)", target)
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".demo-", dir=target.parent))
    try:
        build(scratch)
        try:
            scratch.rename(target)
        except OSError:  # another process won the race
            pass
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target


def ensure_demo_model() -> Path:
    """The demo model's directory, built on first use."""
    return _ensure(cache_root() / f"demo-v{VERSION}", build_demo_model)


def ensure_demo_classifier() -> Path:
    """The classifier variant's directory, built on first use (with the demo model)."""
    lm_dir = ensure_demo_model()
    return _ensure(cache_root() / f"demo-v{VERSION}-classifier", lambda path: build_demo_classifier(lm_dir, path))


if __name__ == "__main__":
    # `python -m prelude.demo [classifier]`: builds if needed and prints the directory, to pass
    # as --model (`python -m prelude` serves the language-model demo without it).
    import sys

    if sys.argv[1:] not in ([], ["classifier"]):
        sys.exit("usage: python -m prelude.demo [classifier]")
    print(ensure_demo_classifier() if sys.argv[1:] else ensure_demo_model())
