"""What the server knows about the model it serves, besides the engine: names, heads, chat
template, and the limits admission checks requests against."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from prelude.model.config import ModelConfig
from prelude.tokenizer import Tokenizer
from prelude.tokenizer.chat import ChatTemplate


@dataclass(frozen=True, slots=True)
class ServedModel:
    name: str
    path: Path
    config: ModelConfig
    tokenizer: Tokenizer
    chat_template: ChatTemplate | None
    max_model_len: int
    kv_capacity_tokens: int  # the most tokens one request's KV may take
    pooling: str  # default embedding pooling: last | mean | cls
    multi_item_scoring: bool = False  # /v1/score may pack items into one masked row
    truncation_side: str = "right"
    eos_token_ids: tuple[int, ...] = ()  # tokenizer_config.json's: which end truncation drops
    # Sampling fields' defaults from generation_config.json (--generation-config auto).
    sampling_defaults: dict[str, float] = field(default_factory=dict)
    sentence_transformers: bool = False  # the checkpoint is a sentence-transformers export (modules.json)
    aliases: tuple[str, ...] = ()  # other names clients may send (--served-model-name's after the first)
    # A sentence-transformers export's named prompts (config_sentence_transformers.json), which
    # TEI's prompt_name puts before a text.
    prompts: dict[str, str] = field(default_factory=dict)
    # What the weights are served in (TEI's /info model_dtype): the checkpoint's, unless --dtype
    # or --quantization changed it.
    dtype: str = "float32"

    @property
    def has_lm_head(self) -> bool:
        return self.config.head == "ForCausalLM"

    @property
    def cuts_texts(self) -> bool:
        """An encoder's texts are cut at max_model_len unless the request says otherwise (as
        sentence-transformers, TEI with truncate and Infinity embed them); a decoder's past its
        context are refused."""
        return self.config.encoder is not None

    @property
    def has_classifier(self) -> bool:
        return self.config.head == "ForSequenceClassification"

    @property
    def pair_scoring(self) -> Literal["cross-encoder", "embedding", "generative"]:
        """How /v1/score and /rerank score a (query, document) pair, decided here only:
        "cross-encoder" (the pair through a classification head), "embedding" (the cosine of the
        two texts' embeddings, as vLLM scores with an embedding model: a model with no LM head,
        or a sentence-transformers export such as Qwen3-Embedding, whose LM head, if any, was
        never trained to answer) or "generative" (a yes/no judge prompt, Qwen3-Reranker style)."""
        if self.has_classifier:
            return "cross-encoder"
        if self.sentence_transformers or not self.has_lm_head:
            return "embedding"
        return "generative"

    @property
    def capabilities(self) -> list[str]:
        """What the model's heads can answer (listed by /v1/models)."""
        if self.has_classifier:
            return ["classify", "score", "embed"]
        if self.has_lm_head:
            return ["generate", "score", "embed"]
        return ["embed", "score"]
