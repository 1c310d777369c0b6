"""The Qwen3 / Qwen2 / Llama decoder (they differ only in q/k norm and q/k/v bias) and its heads."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Protocol, cast

import torch
from torch import nn

from prelude.contract.stop import StopFlag
from prelude.model.attention import AttentionBackend
from prelude.model.config import ModelConfig
from prelude.model.layers import (
    MLP,
    Attention,
    Embedding,
    Linear,
    RMSNorm,
    RotaryEmbedding,
    UsesOps,
    fill,
)
from prelude.model.ops import Ops
from prelude.model.cpu_linear import BY_ROWS, HEAD_LAYOUTS, linear

# HF checkpoint name fragment -> (our fused parameter fragment, shard index within it).
PACKED_WEIGHTS = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}


class ResumableForward(Protocol):
    """A forward that steps aside when asked (cooperative preemption, FlowPrefill): `advance`
    runs it on until it finished (its final-norm hidden states, as forward returns them) or
    until it saw `stop` raised (None; the next call goes on from there). Each call makes some
    progress, so a forward asked to stop at every chance still finishes."""

    def advance(self, attention: AttentionBackend, stop: StopFlag) -> torch.Tensor | None: ...


@dataclass(slots=True)
class LayerState:
    """A forward between layers: the hidden stream, the residual, the step's rotary table."""

    x: torch.Tensor
    residual: torch.Tensor | None
    rope: tuple[torch.Tensor, torch.Tensor]
    # The tokens whose final hidden states are read (None: all). The last layer computes
    # everything after its attention for these tokens only.
    keep: torch.Tensor | None = None
    next_layer: int = 0


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer: int):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, layer)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config.hidden_size, config.intermediate_size)

    def projections(self) -> tuple[Linear, Linear, Linear, Linear]:
        """The layer's linear layers: q/k/v, output, gate/up, down."""
        return self.self_attn.qkv_proj, self.self_attn.o_proj, self.mlp.gate_up_proj, self.mlp.down_proj

    def forward(self, x, residual, rope, attention: AttentionBackend, keep: torch.Tensor | None = None):
        x, residual = self.attend(x, residual, rope, attention, keep)
        return self.mlp(x), residual

    def attend(self, x, residual, rope, attention: AttentionBackend, keep: torch.Tensor | None = None):
        """The layer up to its MLP: (the MLP's input, the residual stream), of every token or
        only of the tokens `keep` indexes."""
        if residual is None:
            residual, x = x, self.input_layernorm(x)
        else:
            x, residual = self.input_layernorm(x, residual)
        x = self.self_attn(x, rope, attention, keep)
        return self.post_attention_layernorm(x, residual if keep is None else residual[keep])


class DecoderModel(nn.Module):
    """The transformer body; the `model.` prefix of HF checkpoint names."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.embed_tokens = Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class DecoderLM(nn.Module):
    """Decoder plus the heads its architecture has: `lm_head` for *ForCausalLM, `score` for
    *ForSequenceClassification, none for *Model (embedding checkpoints)."""

    # The last layer computes only the tokens the heads read (LayerState.keep), and the
    # classifier reads a row's last token.
    skips_unread_tokens = True
    classifier_pooling = "last"

    def __init__(self, config: ModelConfig, max_positions: int):
        super().__init__()
        self.config = config
        self.model = DecoderModel(config)
        self.rotary = RotaryEmbedding(config.rope, config.head_dim, max_positions)
        self.lm_head: Linear | None = None
        self.score: Linear | None = None
        if config.head == "ForCausalLM" and not config.tie_word_embeddings:
            self.lm_head = Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.head == "ForSequenceClassification":
            self.score = Linear(config.hidden_size, config.num_labels, bias=False)

    def set_ops(self, ops: Ops) -> None:
        """Routes every norm, rotation and activation through `ops` (torch, Triton or native).
        A whole step in one native call is the model runner's choice (executor.fused_step)."""
        for module in self.modules():
            if isinstance(module, UsesOps):
                module.ops = ops

    def store_weights(self, format: str) -> None:
        """Keeps the weights as the CPU kernels read them (model.cpu_linear), in `format`: the
        layers' projections packed, and in a narrower format the embedding (with a tied LM
        head) and the LM head in the head's layout. The checkpoint's copies are dropped."""
        for layer in self.model.layers:
            for projection in cast(DecoderLayer, layer).projections():
                projection.store(format)
        self.model.embed_tokens.store(format)
        if self.lm_head is not None:
            self.lm_head.store(format, HEAD_LAYOUTS.get(format, BY_ROWS))

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attention: AttentionBackend,
                keep: torch.Tensor | None = None, on_launch: Callable[[], None] | None = None):
        """Returns the final-norm hidden states [num_tokens, hidden] for the flattened batch, or
        only those of the tokens `keep` indexes ([len(keep), hidden]). `on_launch` is called
        just before the layers run (the caller's cue that the GIL is about to be free)."""
        if on_launch is not None:
            on_launch()
        state = self.layer_state(input_ids, positions, keep)
        self.run_layers(state, attention)
        return self.finish(state)

    def begin(self, input_ids: torch.Tensor, positions: torch.Tensor, attention: AttentionBackend,
              keep: torch.Tensor | None, stop: StopFlag) -> ResumableForward:
        """The forward, to be run in calls that step aside when `stop` is raised between two
        layers (on a GPU a layer is short enough to wait for; on the CPU the runner's native
        step, executor.fused_step, looks at the flag inside layers)."""
        return LayerByLayer(self, self.layer_state(input_ids, positions, keep))

    def layer_state(self, input_ids: torch.Tensor, positions: torch.Tensor,
                    keep: torch.Tensor | None = None) -> LayerState:
        x = self.model.embed_tokens(input_ids)
        return LayerState(x, None, self.rotary.lookup(positions, x.dtype), keep)

    def run_layers(self, state: LayerState, attention: AttentionBackend, stop: StopFlag | None = None) -> bool:
        """Runs the remaining layers, or (with `stop`) at least one and then until it is raised
        between two; whether all ran."""
        layers = self.model.layers
        ran = False
        while state.next_layer < len(layers):
            if ran and stop is not None and stop.is_set():
                return False
            layer = cast(DecoderLayer, layers[state.next_layer])
            keep = state.keep if state.next_layer == len(layers) - 1 else None
            state.x, state.residual = layer(state.x, state.residual, state.rope, attention, keep)
            state.next_layer += 1
            ran = True
        return True

    def finish(self, state: LayerState) -> torch.Tensor:
        x, _ = self.model.norm(state.x, state.residual)
        return x

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        head = self.model.embed_tokens if self.lm_head is None else self.lm_head
        return linear(hidden, head.weight, stored=head.stored)

    def compute_label_logits(self, hidden: torch.Tensor, token_ids: tuple[int, ...]) -> torch.Tensor:
        """Logits of just these tokens: K rows of the LM head instead of the vocabulary."""
        head = self.model.embed_tokens if self.lm_head is None else self.lm_head
        rows = head.weight[list(token_ids)] if head.stored is None else head.stored.rows(list(token_ids))
        return hidden @ rows.t()

    def compute_scores(self, hidden: torch.Tensor) -> torch.Tensor:
        assert self.score is not None, "classify requests reach only *ForSequenceClassification models"
        return self.score(hidden)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Copies checkpoint tensors into the (fused) parameters; returns the parameter names
        that were filled, so the loader can name any that were missing."""
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        for checkpoint_name, tensor in weights:
            name = self._canonical_name(checkpoint_name)
            if name is None:
                continue
            packed = next(((frag, target) for frag, target in PACKED_WEIGHTS.items() if f".{frag}." in name), None)
            if packed is None:
                if name not in params:
                    continue
                fill(params[name], tensor)
                loaded.add(name)
                continue
            fragment, (target, shard) = packed
            name = name.replace(f".{fragment}.", f".{target}.")
            param = params[name]
            sizes = self._shard_sizes(target)
            start = sum(sizes[:shard])
            param.data.narrow(0, start, sizes[shard]).copy_(tensor)
            loaded.add(f"{name}#{shard}")
        return loaded

    def expected_weights(self) -> set[str]:
        expected = set()
        for name, _ in self.named_parameters():
            target = next((t for t in ("qkv_proj", "gate_up_proj") if f".{t}." in name), None)
            if target is None:
                expected.add(name)
            else:
                expected.update(f"{name}#{i}" for i in range(len(self._shard_sizes(target))))
        return expected

    def _shard_sizes(self, target: str) -> list[int]:
        c = self.config
        if target == "qkv_proj":
            return [c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim, c.num_kv_heads * c.head_dim]
        return [c.intermediate_size, c.intermediate_size]

    def _canonical_name(self, name: str) -> str | None:
        if name.startswith("lm_head.") or name.startswith("score."):
            return name
        if name.startswith("model."):
            return name
        # Embedding checkpoints saved from the bare *Model have no `model.` prefix.
        if name.split(".")[0] in ("embed_tokens", "layers", "norm"):
            return "model." + name
        return None


class LayerByLayer:
    """A ResumableForward that looks at the flag between layers."""

    def __init__(self, model: DecoderLM, state: LayerState):
        self.model = model
        self.state = state

    def advance(self, attention: AttentionBackend, stop: StopFlag) -> torch.Tensor | None:
        if not self.model.run_layers(self.state, attention, stop):
            return None
        return self.model.finish(self.state)
