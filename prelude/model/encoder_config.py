"""What an encoder checkpoint's config.json says beyond the fields it shares with the decoders:
BERT, XLM-RoBERTa (BERT with positions offset past the padding id) and ModernBERT (rotary,
alternating local and global attention, no biases). Parsed once, into ModelConfig.encoder."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ENCODER_FAMILIES = {"Bert": "bert", "XLMRoberta": "xlm-roberta", "ModernBert": "modernbert"}
ENCODER_HEADS = ("Model", "ForSequenceClassification")
# The activations encoders use, by their config name; "gelu" is the exact (erf) one.
ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu")


@dataclass(frozen=True, slots=True)
class EncoderConfig:
    kind: str  # bert | xlm-roberta | modernbert
    norm_eps: float
    activation: str
    type_vocab_size: int = 0  # BERT's token types (segment A/B of a pair); 0: none
    # The id that ends segment A: tokens after the first one in a row are segment B.
    sep_token_id: int | None = None
    position_offset: int = 0  # XLM-R numbers positions from padding_idx + 1
    # ModernBERT: per layer, whether it attends globally (else within `window` tokens either side).
    global_layers: tuple[bool, ...] = ()
    window: int = 0
    global_rope_theta: float = 160_000.0
    local_rope_theta: float = 10_000.0
    # Linear and norm biases (BERT and XLM-R have them all; ModernBERT none by default).
    bias: bool = True
    norm_bias: bool = True
    # The sequence classifier: which states it reads (cls | mean) and its head's activation.
    classifier_pooling: str = "cls"
    classifier_activation: str = "tanh"
    classifier_bias: bool = True

    @property
    def learned_positions(self) -> bool:
        """A table of position embeddings (BERT's, XLM-R's), with no row past its length;
        ModernBERT's positions are rotary."""
        return self.kind != "modernbert"


def unsupported(raw: dict[str, Any]) -> str | None:
    """Why Prelude cannot run this encoder config (None: it can)."""
    activation = _activation(raw)
    if activation not in ACTIVATIONS:
        return f"hidden activation {activation!r} is not supported ({', '.join(ACTIVATIONS)})"
    if raw.get("position_embedding_type", "absolute") != "absolute":
        return f"position_embedding_type {raw['position_embedding_type']!r} is not supported (absolute)"
    return None


def _activation(raw: dict[str, Any]) -> str:
    return raw.get("hidden_act") or raw.get("hidden_activation") or "gelu"


def encoder_config(family: str, raw: dict[str, Any], sep_token_id: int | None) -> EncoderConfig:
    activation = _activation(raw)
    if family == "modernbert":
        every = int(raw.get("global_attn_every_n_layers", 3))
        types = raw.get("layer_types") or ["full_attention" if i % every == 0 else "sliding_attention"
                                           for i in range(raw["num_hidden_layers"])]
        rope = raw.get("rope_parameters") or {}
        return EncoderConfig(
            kind=family, norm_eps=float(raw.get("norm_eps", 1e-5)), activation=activation,
            global_layers=tuple(t == "full_attention" for t in types),
            window=int(raw.get("local_attention", 128)) // 2,
            global_rope_theta=float((rope.get("full_attention") or {}).get(
                "rope_theta", raw.get("global_rope_theta", 160_000.0))),
            local_rope_theta=float((rope.get("sliding_attention") or {}).get(
                "rope_theta", raw.get("local_rope_theta", 10_000.0))),
            bias=bool(raw.get("attention_bias", False)) or bool(raw.get("mlp_bias", False)),
            norm_bias=bool(raw.get("norm_bias", False)),
            classifier_pooling=raw.get("classifier_pooling", "cls"),
            classifier_activation=raw.get("classifier_activation", "gelu"),
            classifier_bias=bool(raw.get("classifier_bias", False)))
    type_vocab_size = int(raw.get("type_vocab_size", 2))
    return EncoderConfig(
        kind=family, norm_eps=float(raw.get("layer_norm_eps", 1e-12)), activation=activation,
        # XLM-R's tokenizer gives no token types (its model reads all 0), whatever its table holds.
        type_vocab_size=type_vocab_size,
        sep_token_id=sep_token_id if type_vocab_size > 1 and family == "bert" else None,
        position_offset=_position_offset(family, raw))


def usable_positions(family: str, raw: dict[str, Any]) -> int:
    """The longest sequence the position table covers (XLM-R's first rows are never used)."""
    return int(raw.get("max_position_embeddings", 512)) - _position_offset(family, raw)


def _position_offset(family: str, raw: dict[str, Any]) -> int:
    """XLM-R numbers positions from its padding id + 1; BERT from 0."""
    return int(raw.get("pad_token_id", 1)) + 1 if family == "xlm-roberta" else 0


def sep_token_id(model_dir: Path) -> int | None:
    """The separator's id, from tokenizer.json's added tokens: BERT's config does not name it,
    and the model needs it to tell a pair's second segment (token type 1) from its first."""
    name = "[SEP]"
    config = model_dir / "tokenizer_config.json"
    if config.is_file():
        sep = json.loads(config.read_text()).get("sep_token")
        name = sep.get("content", name) if isinstance(sep, dict) else sep or name
    tokenizer = model_dir / "tokenizer.json"
    if not tokenizer.is_file():
        return None
    added = json.loads(tokenizer.read_text(encoding="utf-8")).get("added_tokens", [])
    return next((t["id"] for t in added if t.get("content") == name), None)
