"""The subset of an HF config.json the model code needs, parsed and validated once."""
from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from prelude.model.encoder_config import (
    ENCODER_FAMILIES,
    ENCODER_HEADS,
    EncoderConfig,
    encoder_config,
    sep_token_id,
    unsupported,
    usable_positions,
)

# Causal-LM architectures and the sequence-classification variants built on the same decoder.
DECODER_FAMILIES = {"Qwen3": "qwen3", "Qwen2": "qwen2", "Llama": "llama"}
HEADS = ("ForCausalLM", "ForSequenceClassification", "Model")
SUPPORTED_ARCHITECTURES = tuple(f"{family}{head}" for family in DECODER_FAMILIES for head in HEADS) + tuple(
    f"{family}{head}" for family in ENCODER_FAMILIES for head in ENCODER_HEADS)


class UnsupportedModel(ValueError):
    """The checkpoint's architecture or configuration is outside what Prelude implements."""


@dataclass(frozen=True, slots=True)
class RopeConfig:
    theta: float
    kind: str = "default"  # default | linear | llama3
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192


@dataclass(frozen=True, slots=True)
class ModelConfig:
    architecture: str
    family: str  # qwen3 | qwen2 | llama | bert | xlm-roberta | modernbert
    head: str  # ForCausalLM | ForSequenceClassification | Model
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope: RopeConfig
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    qk_norm: bool
    checkpoint_dtype: str | None
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None
    pad_token_id: int | None = None
    id2label: dict[int, str] = field(default_factory=dict)
    # A classifier's labels are independent (sigmoid each, as transformers' pipeline and vLLM read
    # problem_type "multi_label_classification"), else exclusive (softmax).
    multi_label: bool = False
    encoder: EncoderConfig | None = None  # set for the bidirectional encoders (BERT, XLM-R, ModernBERT)
    int8_weights: bool = False  # compressed-tensors int8 weights (model.quantized_checkpoint)

    @property
    def num_labels(self) -> int:
        return len(self.id2label)

    def kv_bytes_per_block(self, block_size: int, itemsize: int) -> int:
        """A paged KV block's bytes over every layer, K and V, at `itemsize` bytes an element."""
        return 2 * self.num_layers * block_size * self.num_kv_heads * self.head_dim * itemsize

    @classmethod
    def from_dict(cls, raw: dict[str, Any], sep_id: int | None = None) -> ModelConfig:
        """`sep_id`: the tokenizer's separator, which a BERT pair's token types need."""
        architectures = raw.get("architectures") or []
        architecture = architectures[0] if architectures else None
        family_head = _split_architecture(architecture)
        if architecture is None or family_head is None:
            raise UnsupportedModel(
                f"architecture {architecture!r} is not supported; serve a checkpoint of one of: "
                + ", ".join(SUPPORTED_ARCHITECTURES)
            )
        family, head = family_head
        if family in ENCODER_FAMILIES.values():
            return cls._encoder(raw, architecture, family, head, sep_id)
        if raw.get("hidden_act", "silu") != "silu":
            raise UnsupportedModel(f"hidden_act {raw['hidden_act']!r} is not supported (only silu)")
        problem = _sliding_window(raw)
        if problem is not None:
            raise UnsupportedModel(problem)
        num_heads = raw["num_attention_heads"]
        # transformers' Qwen3Config defaults head_dim to 128, not hidden_size / heads
        head_dim = raw.get("head_dim") or (128 if family == "qwen3" else raw["hidden_size"] // num_heads)
        return cls(
            architecture=architecture,
            family=family,
            head=head,
            vocab_size=raw["vocab_size"],
            hidden_size=raw["hidden_size"],
            intermediate_size=raw["intermediate_size"],
            num_layers=raw["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=raw.get("num_key_value_heads") or num_heads,
            head_dim=head_dim,
            rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
            rope=_rope_config(raw),
            max_position_embeddings=raw.get("max_position_embeddings", 4096),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            # Qwen2 always has q/k/v biases; Llama and Qwen3 say so in attention_bias.
            attention_bias=family == "qwen2" or bool(raw.get("attention_bias", False)),
            qk_norm=family == "qwen3",
            checkpoint_dtype=raw.get("torch_dtype") or raw.get("dtype"),
            eos_token_ids=_as_ids(raw.get("eos_token_id")),
            bos_token_id=raw.get("bos_token_id"),
            pad_token_id=raw.get("pad_token_id"),
            id2label=_id2label(raw, head), multi_label=raw.get("problem_type") == "multi_label_classification",
            int8_weights=int8_weights(raw),
        )

    @classmethod
    def _encoder(cls, raw: dict[str, Any], architecture: str, family: str, head: str,
                 sep_id: int | None) -> ModelConfig:
        problem = unsupported(raw)
        if problem is not None:
            raise UnsupportedModel(problem)
        if int8_weights(raw):
            raise UnsupportedModel(f"{architecture} with int8 weights: quantized encoder checkpoints are not read")
        num_heads = raw["num_attention_heads"]
        return cls(
            architecture=architecture, family=family, head=head, vocab_size=raw["vocab_size"],
            hidden_size=raw["hidden_size"], intermediate_size=raw["intermediate_size"],
            num_layers=raw["num_hidden_layers"], num_heads=num_heads, num_kv_heads=num_heads,
            head_dim=raw["hidden_size"] // num_heads, rms_norm_eps=0.0, rope=RopeConfig(theta=10_000.0),
            max_position_embeddings=usable_positions(family, raw), tie_word_embeddings=False,
            attention_bias=True, qk_norm=False, checkpoint_dtype=raw.get("torch_dtype") or raw.get("dtype"),
            pad_token_id=raw.get("pad_token_id"), id2label=_id2label(raw, head),
            multi_label=raw.get("problem_type") == "multi_label_classification",
            encoder=encoder_config(family, raw, sep_id))

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> ModelConfig:
        path = Path(model_dir) / "config.json"
        if not path.is_file():
            raise UnsupportedModel(f"{path} not found: --model must be a local HF-format directory")
        raw = json.loads(path.read_text())
        # Only BERT reads token types: no other model's tokenizer.json (Qwen3's: 11 MB) is parsed here.
        family_head = _split_architecture((raw.get("architectures") or [None])[0])
        bert = family_head is not None and family_head[0] == "bert"
        try:
            config = cls.from_dict(raw, sep_token_id(Path(model_dir)) if bert else None)
        except KeyError as exc:  # a field every config of its family has: a traceback, it was
            raise UnsupportedModel(f"{path} lacks {exc}, which {raw.get('architectures')} configs hold") from None
        # generation_config.json is authoritative for the eos ids generation stops at.
        eos = _as_ids(_generation_config(model_dir).get("eos_token_id"))
        if eos:
            config = replace(config, eos_token_ids=tuple(dict.fromkeys(eos + config.eos_token_ids)))
        return config


def int8_weights(raw: dict[str, Any]) -> bool:
    """Whether config.json's `quantization_config` holds the int8 weights Prelude reads (False:
    none); raises UnsupportedModel for any other."""
    quantization = raw.get("quantization_config")
    if not quantization:
        return False
    method = quantization.get("quant_method")
    groups = quantization.get("config_groups") or {}
    weights = [group.get("weights") or {} for group in groups.values()]
    if (method == "compressed-tensors" and quantization.get("format") == "int-quantized" and weights
            and all(w.get("num_bits") == 8 and w.get("type") == "int" and w.get("symmetric", True)
                    and w.get("strategy") == "channel" for w in weights)):
        return True
    raise UnsupportedModel(f"quantization_config {method!r} ({quantization.get('format')!r}) is not supported: "
                           "Prelude reads unquantized checkpoints and compressed-tensors int-quantized 8-bit "
                           "symmetric per-channel weights (W8A8 / W8A16); on the CPU, --quantization int8 "
                           "quantizes an unquantized checkpoint at load")


# generation_config.json's sampling fields vLLM (--generation-config auto, its default) takes as
# the defaults of requests that leave them out, and transformers' own defaults for them: vLLM
# reads the file's difference from those (GenerationConfig.to_diff_dict), so a field left at
# transformers' default (top_k 50 among them) is no default of vLLM's.
SAMPLING_DEFAULT_FIELDS = {"temperature": 1.0, "top_p": 1.0, "top_k": 50, "min_p": None, "repetition_penalty": 1.0,
                           "max_new_tokens": None}


def sampling_defaults(model_dir: str | Path) -> dict[str, float]:
    """The model's own defaults for temperature, top_p, top_k, min_p and repetition_penalty
    (Qwen3's file: temperature 0.6, top_p 0.95, top_k 20), as vLLM applies them; and its
    max_new_tokens as "max_tokens", which vLLM makes the most any request generates."""
    raw = _generation_config(model_dir)
    defaults = {name: raw[name] for name, hf_default in SAMPLING_DEFAULT_FIELDS.items()
                if isinstance(raw.get(name), (int, float)) and not isinstance(raw[name], bool)
                and raw[name] != hf_default}
    if "max_new_tokens" in defaults:
        defaults["max_tokens"] = defaults.pop("max_new_tokens")
    return defaults


def _generation_config(model_dir: str | Path) -> dict:
    """The model's generation_config.json ({} without one)."""
    path = Path(model_dir) / "generation_config.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def _split_architecture(architecture: str | None) -> tuple[str, str] | None:
    if architecture is None:
        return None
    for families, heads in ((DECODER_FAMILIES, HEADS), (ENCODER_FAMILIES, ENCODER_HEADS)):
        for prefix, family in families.items():
            for head in heads:
                if architecture == prefix + head:
                    return family, head
    return None


def _sliding_window(raw: dict[str, Any]) -> str | None:
    """Why a config's attention is not this server's (full causal attention on every layer): a
    sliding window on some layers, as transformers reads `layer_types`, else Qwen2/Qwen3's
    use_sliding_window from max_window_layers on. Served with full attention, a prompt past the
    window got other numbers from its first token beyond it."""
    layer_types = raw.get("layer_types")
    if isinstance(layer_types, list):
        windowed = [i for i, kind in enumerate(layer_types) if kind != "full_attention"]
    elif raw.get("use_sliding_window") and raw.get("sliding_window"):
        windowed = list(range(raw.get("max_window_layers", 0), raw["num_hidden_layers"]))
    else:
        windowed = []
    if not windowed:
        return None
    return (f"sliding-window attention (window {raw.get('sliding_window')} on {len(windowed)} of "
            f"{raw['num_hidden_layers']} layers) is not supported: every layer attends to the whole context")


def _id2label(raw: dict[str, Any], head: str) -> dict[int, str]:
    id2label = {int(k): str(v) for k, v in (raw.get("id2label") or {}).items()}
    if head == "ForSequenceClassification" and not id2label:
        # transformers leaves id2label out of config.json at its default, num_labels=2
        id2label = {i: f"LABEL_{i}" for i in range(raw.get("num_labels", 2))}
    return id2label


def _as_ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)


def _rope_config(raw: dict[str, Any]) -> RopeConfig:
    # transformers >= 5 writes rope_parameters; older checkpoints write rope_theta + rope_scaling.
    params = dict(raw.get("rope_parameters") or raw.get("rope_scaling") or {})
    theta = float(params.get("rope_theta", raw.get("rope_theta", 10000.0)))
    kind = params.get("rope_type", params.get("type", "default")) or "default"
    if kind == "default":
        return RopeConfig(theta=theta)
    if kind == "linear":
        return RopeConfig(theta=theta, kind=kind, factor=float(params["factor"]))
    if kind == "llama3":
        return RopeConfig(
            theta=theta,
            kind=kind,
            factor=float(params["factor"]),
            low_freq_factor=float(params["low_freq_factor"]),
            high_freq_factor=float(params["high_freq_factor"]),
            original_max_position=int(params["original_max_position_embeddings"]),
        )
    raise UnsupportedModel(f"rope type {kind!r} is not supported (default, linear, llama3)")
