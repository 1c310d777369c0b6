"""ModernBERT (ModernBertModel, ModernBertForSequenceClassification): pre-norm blocks without
biases, rotary positions, a gated GELU MLP, and attention that alternates between global layers
and local ones (each token sees the tokens within half the local window either side), each kind
with its own rotary base."""
from __future__ import annotations

import torch
from torch import nn

from prelude.model.attention import AttentionBackend
from kernels.cpu import ops as cpu_ops
from kernels.reference import rotate
from prelude.model.config import ModelConfig, RopeConfig
from prelude.model.encoder import ACTIVATION_FUNCTIONS, Dense, EncoderLM, LayerNorm, Rename
from prelude.model.layers import Embedding, Linear, RotaryEmbedding

MODERNBERT_RENAMES: tuple[Rename, ...] = (
    (r"embeddings\.(tok_embeddings|norm)\.(weight|bias)", r"embeddings.\1.\2", None),
    (r"layers\.(\d+)\.(attn\.Wqkv|attn\.Wo|attn_norm|mlp\.Wi|mlp\.Wo|mlp_norm)\.(weight|bias)", r"layers.\1.\2.\3",
     None),
    (r"final_norm\.(weight|bias)", r"final_norm.\1", None),
    (r"head\.(dense|norm)\.(weight|bias)", r"head.\1.\2", None),
    (r"classifier\.(weight|bias)", r"classifier.\1", None),
)


class ModernBertAttention(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        bias = config.encoder is not None and config.encoder.bias
        self.Wqkv = Dense(config.hidden_size, 3 * config.hidden_size, bias=bias)
        self.Wo = Dense(config.hidden_size, config.hidden_size, bias=bias)


class ModernBertMLP(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        bias = config.encoder is not None and config.encoder.bias
        self.Wi = Dense(config.hidden_size, 2 * config.intermediate_size, bias=bias)
        self.Wo = Dense(config.intermediate_size, config.hidden_size, bias=bias)


class ModernBertLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer: int, rotary: RotaryEmbedding):
        super().__init__()
        e = config.encoder
        assert e is not None
        self.attn_norm = LayerNorm(config.hidden_size, e.norm_eps, e.norm_bias) if layer else None
        self.attn = ModernBertAttention(config)
        self.mlp_norm = LayerNorm(config.hidden_size, e.norm_eps, e.norm_bias)
        self.mlp = ModernBertMLP(config)
        self.act = ACTIVATION_FUNCTIONS[e.activation]
        self.gelu_gated = e.activation == "gelu"  # the erf GELU: GeGLU on the native kernels
        self.window = 0 if e.global_layers[layer] else e.window
        self.rotary = rotary
        self.num_heads, self.head_dim = config.num_heads, config.head_dim

    def forward(self, x: torch.Tensor, attention: AttentionBackend, positions: torch.Tensor) -> torch.Tensor:
        normed = x if self.attn_norm is None else self.attn_norm(x)
        q, k, v = self.attn.Wqkv(normed).view(len(x), 3, self.num_heads, self.head_dim).unbind(1)
        cos, sin = self.rotary.lookup(positions, x.dtype)
        attended = attention.bidirectional(rotate(q, cos, sin), rotate(k, cos, sin), v, self.window)
        x = x + self.attn.Wo(attended.reshape(len(x), -1))
        projected = self.mlp.Wi(self.mlp_norm(x))
        if self.gelu_gated:  # one native pass on the CPU in fp32 (cpu_ops falls back elsewhere)
            return x + self.mlp.Wo(cpu_ops.gelu_and_mul(projected))
        hidden, gate = projected.chunk(2, dim=-1)
        return x + self.mlp.Wo(self.act(hidden) * gate)


class ModernBertEmbeddings(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        e = config.encoder
        assert e is not None
        self.tok_embeddings = Embedding(config.vocab_size, config.hidden_size)
        self.norm = LayerNorm(config.hidden_size, e.norm_eps, e.norm_bias)


class ModernBertHead(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        e = config.encoder
        assert e is not None
        self.dense = Dense(config.hidden_size, config.hidden_size, bias=e.classifier_bias)
        self.norm = LayerNorm(config.hidden_size, e.norm_eps, e.norm_bias)


class ModernBertLM(EncoderLM):
    renames = MODERNBERT_RENAMES
    body_prefixes = ("model.",)

    def __init__(self, config: ModelConfig, max_positions: int):
        super().__init__(config, max_positions)
        e = config.encoder
        assert e is not None
        self.embeddings = ModernBertEmbeddings(config)
        rotaries = {True: RotaryEmbedding(RopeConfig(e.global_rope_theta), config.head_dim, max_positions),
                    False: RotaryEmbedding(RopeConfig(e.local_rope_theta), config.head_dim, max_positions)}
        self.layers = nn.ModuleList(ModernBertLayer(config, i, rotaries[e.global_layers[i]])
                                    for i in range(config.num_layers))
        self.final_norm = LayerNorm(config.hidden_size, e.norm_eps, e.norm_bias)
        for rotary in rotaries.values():  # on the device the parameters were made on
            rotary.materialize(self.final_norm.weight.device)
        self.head: ModernBertHead | None = None
        self.classifier: Linear | None = None
        self.classifier_act = ACTIVATION_FUNCTIONS[e.classifier_activation]
        if config.head == "ForSequenceClassification":
            self.head = ModernBertHead(config)
            self.classifier = Dense(config.hidden_size, config.num_labels, bias=True)

    def embed(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.embeddings.norm(self.embeddings.tok_embeddings(input_ids))

    def finish(self, x: torch.Tensor) -> torch.Tensor:
        return self.final_norm(x)

    def classify(self, pooled: torch.Tensor) -> torch.Tensor:
        assert self.head is not None and self.classifier is not None, "classify reaches only classifiers"
        return self.classifier(self.head.norm(self.classifier_act(self.head.dense(pooled))))
