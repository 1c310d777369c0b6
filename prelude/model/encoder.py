"""What the bidirectional encoders (prelude.model.bert, prelude.model.modernbert) share: the model
runner's surface (forward, a forward that steps aside, the classifier head), LayerNorm and
activations, and loading checkpoint tensors under renamed, possibly fused, parameters.

An encoder runs on the OneShot path only: every row is a whole text, its positions start at 0,
nothing it computes is cached (a token's state depends on the tokens after it, so a cached prefix
would be wrong), and it has no LM head to generate with."""
from __future__ import annotations

import re
from typing import Callable, Iterable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from kernels.cpu import ops as cpu_ops
from prelude.contract.stop import StopFlag
from prelude.model.attention import AttentionBackend
from prelude.model.config import ModelConfig
from prelude.model.cpu_linear import EPILOGUE_ACTIVATIONS, PANELS, linear
from prelude.model.layers import Linear, fill

ACTIVATION_FUNCTIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu": cpu_ops.gelu,  # native in fp32 on the CPU, else F.gelu
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
    "tanh": torch.tanh,
}

# A checkpoint name pattern, the parameter it fills (a re.sub template), and which of the
# parameter's equal row blocks it is (None: all of it).
Rename = tuple[str, str, int | None]


class Dense(Linear):
    """An encoder's linear layer, with the activation that follows it (BERT's intermediate GELU).
    On the CPU its weight is kept packed, in fp32 (or bf16x3) or bf16 (EncoderLM.store_weights), and its bias and
    GELU run in the product's epilogue (kernels/cpu/packed_gemm.hpp) on the native kernels'
    threads, as the attention and LayerNorm between the products do: nothing of a layer is left to
    torch's threads, which contended with the native ones for the two cores (the packed product
    beside torch's GELU and LayerNorm was slower than MKL's; all-MiniLM, 32 texts). Elsewhere
    (fp16, CUDA): torch's F.linear, then the activation."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, activation: str | None = None):
        super().__init__(in_features, out_features, bias=bias)
        # An activation the kernels' epilogue has goes to the product (cpu_linear.linear), any
        # other runs after it.
        fused = activation in EPILOGUE_ACTIVATIONS
        self.epilogue = activation if fused else None
        self.after = None if fused or activation is None else ACTIVATION_FUNCTIONS[activation]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = linear(x, self.weight, self.bias, self.stored, self.epilogue)
        return out if self.after is None else self.after(out)


class LayerNorm(nn.Module):
    """LayerNorm without initialization (the checkpoint fills it); `bias=False` for ModernBERT. In
    fp32 on the CPU one native pass (kernels/cpu/ops.py): on a short text's few rows torch's
    LayerNorm and GELU cost 60-100 us a call in hand-offs to its threads, over half of the forward."""

    def __init__(self, dim: int, eps: float, bias: bool = True):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(dim))
        self.bias = nn.Parameter(torch.empty(dim)) if bias else None
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """The norm of x (+ residual, added first)."""
        return cpu_ops.layer_norm(x, self.weight, self.bias, self.eps, residual)


class EncoderLM(nn.Module):
    """An encoder body and, for *ForSequenceClassification, its classifier. Subclasses build
    `layers` (each called as layer(x, attention, positions)) and define `embed`, `finish`,
    `classify` and their checkpoint `renames`."""

    # The last layer computes every token: an encoder's states are pooled, not read at one token.
    skips_unread_tokens = False
    renames: Sequence[Rename] = ()
    # Name prefixes the *ForSequenceClassification checkpoints put before the body's tensors.
    body_prefixes: tuple[str, ...] = ()
    fused: re.Pattern[str] | None = None  # parameters filled from three checkpoint tensors (q, k, v)

    def __init__(self, config: ModelConfig, max_positions: int):
        """`max_positions`: the longest row served (the position tables are the checkpoint's)."""
        super().__init__()
        assert config.encoder is not None
        self.config = config
        self.encoder_config = config.encoder
        self.classifier_pooling = config.encoder.classifier_pooling  # which states compute_scores reads

    layers: nn.ModuleList  # each called as layer(x, attention, positions)

    # -- what subclasses define ------------------------------------------------------------------
    def embed(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def finish(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def classify(self, pooled: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    # -- the model runner's surface (executor.runnable.RunnableModel) -----------------------------
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attention: AttentionBackend,
                keep: torch.Tensor | None = None, on_launch: Callable[[], None] | None = None) -> torch.Tensor:
        if on_launch is not None:
            on_launch()
        forward = self.begin(input_ids, positions, attention, keep, None)
        hidden = forward.advance(attention, None)
        assert hidden is not None
        return hidden

    def begin(self, input_ids: torch.Tensor, positions: torch.Tensor, attention: AttentionBackend,
              keep: torch.Tensor | None, stop: StopFlag | None) -> EncoderForward:
        return EncoderForward(self, self.embed(input_ids, positions), positions, keep)

    def compute_scores(self, pooled: torch.Tensor) -> torch.Tensor:
        return self.classify(pooled)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        raise RuntimeError(f"{self.config.architecture} is an encoder: it has no LM head")

    def compute_label_logits(self, hidden: torch.Tensor, token_ids: tuple[int, ...]) -> torch.Tensor:
        return self.compute_logits(hidden)

    # -- weights ------------------------------------------------------------------------------------
    def store_weights(self, format: str) -> None:
        """Keeps the dense layers' weights packed for the CPU kernels (Dense) in `format`
        (cpu_weight_format's: float32, bf16x3 or bfloat16)."""
        for module in self.modules():
            if isinstance(module, Dense):
                module.store(format, PANELS)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Copies checkpoint tensors into the parameters their renames name; returns what was
        filled ("name#block" for one block of a fused parameter)."""
        params = dict(self.named_parameters())
        patterns = [(re.compile(pattern), target, block) for pattern, target, block in self.renames]
        loaded: set[str] = set()
        for checkpoint_name, tensor in weights:
            name = next((checkpoint_name[len(p):] for p in self.body_prefixes if checkpoint_name.startswith(p)),
                        checkpoint_name)
            for pattern, target, block in patterns:
                if pattern.fullmatch(name) is None:
                    continue
                param_name = pattern.sub(target, name)
                if param_name not in params:
                    break
                param = params[param_name]
                if block is None:
                    fill(param, tensor)
                    loaded.add(param_name)
                else:
                    size = param.shape[0] // 3  # the fused q/k/v blocks
                    param.data.narrow(0, block * size, size).copy_(tensor)
                    loaded.add(f"{param_name}#{block}")
                break
        return loaded

    def expected_weights(self) -> set[str]:
        expected: set[str] = set()
        for name, _ in self.named_parameters():
            if self.fused is not None and self.fused.fullmatch(name):
                expected.update(f"{name}#{i}" for i in range(3))
            else:
                expected.add(name)
        return expected


class EncoderForward:
    """An encoder's forward in calls that step aside between layers when asked (the model
    runner's ResumableForward)."""

    def __init__(self, model: EncoderLM, x: torch.Tensor, positions: torch.Tensor, keep: torch.Tensor | None):
        self.model, self.x, self.positions, self.keep = model, x, positions, keep
        self.next_layer = 0

    def advance(self, attention: AttentionBackend, stop: StopFlag | None) -> torch.Tensor | None:
        if not self._run_layers(attention, stop):
            return None
        hidden = self.model.finish(self.x)
        return hidden if self.keep is None else hidden[self.keep]

    def _run_layers(self, attention: AttentionBackend, stop: StopFlag | None) -> bool:
        layers = self.model.layers
        ran = False
        with cpu_ops.team_held():  # each layer is several native calls with Python between them
            while self.next_layer < len(layers):
                if ran and stop is not None and stop.is_set():
                    return False
                self.x = layers[self.next_layer](self.x, attention, self.positions)
                self.next_layer += 1
                ran = True
        return True
