"""BERT and XLM-RoBERTa (BertModel, XLMRobertaModel and their *ForSequenceClassification): learned
absolute positions, token types, post-layer-norm blocks with biases everywhere. XLM-R is BERT
with its positions numbered from the padding id + 1 and its classifier on the first token
without BERT's pooler."""
from __future__ import annotations

import re

import torch
import torch.nn.functional as F
from torch import nn

from prelude.model.attention import AttentionBackend
from prelude.model.config import ModelConfig
from prelude.model.encoder import Dense, EncoderLM, LayerNorm, Rename
from prelude.model.layers import Embedding, Linear

_LAYER = r"encoder\.layer\.(\d+)\."
BERT_RENAMES: tuple[Rename, ...] = (
    (r"embeddings\.(word_embeddings|position_embeddings|token_type_embeddings|LayerNorm)\.(weight|bias)",
     r"embeddings.\1.\2", None),
    *((_LAYER + rf"attention\.self\.{part}\.(weight|bias)", r"layers.\1.qkv.\2", block)
      for block, part in enumerate(("query", "key", "value"))),
    (_LAYER + r"attention\.output\.dense\.(weight|bias)", r"layers.\1.attention_out.\2", None),
    (_LAYER + r"attention\.output\.LayerNorm\.(weight|bias)", r"layers.\1.attention_norm.\2", None),
    (_LAYER + r"intermediate\.dense\.(weight|bias)", r"layers.\1.up.\2", None),
    (_LAYER + r"output\.dense\.(weight|bias)", r"layers.\1.down.\2", None),
    (_LAYER + r"output\.LayerNorm\.(weight|bias)", r"layers.\1.mlp_norm.\2", None),
    (r"pooler\.dense\.(weight|bias)", r"pooler.\1", None),
    (r"classifier\.(dense|out_proj)\.(weight|bias)", r"classifier_\1.\2", None),  # XLM-R's head
    (r"classifier\.(weight|bias)", r"classifier.\1", None),  # BERT's
)


class BertEmbeddings(nn.Module):
    def __init__(self, config: ModelConfig, positions: int):
        super().__init__()
        e = config.encoder
        assert e is not None
        self.word_embeddings = Embedding(config.vocab_size, config.hidden_size)
        self.position_embeddings = Embedding(positions, config.hidden_size)
        self.token_type_embeddings = Embedding(max(1, e.type_vocab_size), config.hidden_size)
        self.LayerNorm = LayerNorm(config.hidden_size, e.norm_eps)
        self.position_offset = e.position_offset
        self.sep_token_id = e.sep_token_id

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x = self.word_embeddings(input_ids) + self.position_embeddings(positions + self.position_offset)
        if self.sep_token_id is None:
            x += self.token_type_embeddings.weight[0]
        else:
            x += F.embedding(token_types(input_ids, positions, self.sep_token_id), self.token_type_embeddings.weight)
        return self.LayerNorm(x)


def token_types(input_ids: torch.Tensor, positions: torch.Tensor, sep: int) -> torch.Tensor:
    """0 up to and including each row's first separator, 1 after it: segment B of a text pair
    ([CLS] A [SEP] B [SEP]), as the tokenizer's pair template numbers it. Rows start at position 0."""
    is_sep = (input_ids == sep).long()
    before = is_sep.cumsum(0) - is_sep  # separators strictly before each token, across the step
    starts = positions == 0
    row = starts.long().cumsum(0) - 1
    return (before - before[starts][row] > 0).long()


class BertLayer(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        e = config.encoder
        assert e is not None
        hidden = config.hidden_size
        self.num_heads, self.head_dim = config.num_heads, config.head_dim
        self.qkv = Dense(hidden, 3 * hidden, bias=True)
        self.attention_out = Dense(hidden, hidden, bias=True)
        self.attention_norm = LayerNorm(hidden, e.norm_eps)
        self.up = Dense(hidden, config.intermediate_size, bias=True, activation=e.activation)
        self.down = Dense(config.intermediate_size, hidden, bias=True)
        self.mlp_norm = LayerNorm(hidden, e.norm_eps)

    def forward(self, x: torch.Tensor, attention: AttentionBackend, positions: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).view(len(x), 3, self.num_heads, self.head_dim).unbind(1)
        attended = attention.bidirectional(q, k, v).reshape(len(x), -1)
        x = self.attention_norm(self.attention_out(attended), residual=x)
        return self.mlp_norm(self.down(self.up(x)), residual=x)


class BertLM(EncoderLM):
    """BertModel / XLMRobertaModel (embeddings) and their *ForSequenceClassification."""

    renames = BERT_RENAMES
    body_prefixes = ("bert.", "roberta.")
    fused = re.compile(r"layers\.\d+\.qkv\.(weight|bias)")

    def __init__(self, config: ModelConfig, max_positions: int):
        super().__init__(config, max_positions)
        e = config.encoder
        assert e is not None
        self.embeddings = BertEmbeddings(config, config.max_position_embeddings + e.position_offset)
        self.layers = nn.ModuleList(BertLayer(config) for _ in range(config.num_layers))
        hidden = config.hidden_size
        self.pooler: Linear | None = None
        self.classifier: Linear | None = None
        self.classifier_dense: Linear | None = None
        self.classifier_out_proj: Linear | None = None
        if config.head == "ForSequenceClassification" and e.kind == "xlm-roberta":
            self.classifier_dense = Dense(hidden, hidden, bias=True)
            self.classifier_out_proj = Dense(hidden, config.num_labels, bias=True)
        elif config.head == "ForSequenceClassification":
            self.pooler = Dense(hidden, hidden, bias=True)
            self.classifier = Dense(hidden, config.num_labels, bias=True)

    def embed(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.embeddings(input_ids, positions)

    def classify(self, pooled: torch.Tensor) -> torch.Tensor:
        if self.classifier_dense is not None and self.classifier_out_proj is not None:
            return self.classifier_out_proj(torch.tanh(self.classifier_dense(pooled)))
        assert self.pooler is not None and self.classifier is not None, "classify reaches only classifiers"
        return self.classifier(torch.tanh(self.pooler(pooled)))
